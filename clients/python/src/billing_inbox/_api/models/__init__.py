"""Contains all the data models used in inputs/outputs"""

from .account import Account
from .account_events import AccountEvents
from .account_events_events_item import AccountEventsEventsItem
from .allowance_exhausted_effect import AllowanceExhaustedEffect
from .allowance_exhausted_effect_data import AllowanceExhaustedEffectData
from .allowance_exhausted_effect_data_usage import AllowanceExhaustedEffectDataUsage
from .allowance_granted_effect import AllowanceGrantedEffect
from .allowance_granted_effect_data import AllowanceGrantedEffectData
from .allowance_granted_effect_data_grant import AllowanceGrantedEffectDataGrant
from .bad_request_error import BadRequestError
from .beaten import Beaten
from .credit_balance import CreditBalance
from .credit_balance_why import CreditBalanceWhy
from .credit_debit import CreditDebit
from .credit_debit_from_grants_item import CreditDebitFromGrantsItem
from .credit_event import CreditEvent
from .credit_grant import CreditGrant
from .credit_grant_told import CreditGrantTold
from .credits_ import Credits
from .credits_crossed_effect import CreditsCrossedEffect
from .credits_crossed_effect_data import CreditsCrossedEffectData
from .credits_effect_data import CreditsEffectData
from .credits_expired_effect import CreditsExpiredEffect
from .credits_expired_effect_data import CreditsExpiredEffectData
from .credits_granted_effect import CreditsGrantedEffect
from .credits_granted_effect_data import CreditsGrantedEffectData
from .credits_voided_effect import CreditsVoidedEffect
from .credits_voided_effect_data import CreditsVoidedEffectData
from .customer_deleted_effect import CustomerDeletedEffect
from .customer_deleted_effect_data import CustomerDeletedEffectData
from .debit import Debit
from .debit_allocation import DebitAllocation
from .debit_allocation_from_grants_item import DebitAllocationFromGrantsItem
from .debit_request import DebitRequest
from .effect import Effect
from .effect_account import EffectAccount
from .effect_data import EffectData
from .effect_subscription_state import EffectSubscriptionState
from .error import Error
from .event_ref import EventRef
from .exhausted import Exhausted
from .exhausted_grants_item import ExhaustedGrantsItem
from .feature_check import FeatureCheck
from .feature_decider import FeatureDecider
from .features import Features
from .features_changed_effect import FeaturesChangedEffect
from .features_changed_effect_data import FeaturesChangedEffectData
from .features_changed_effect_data_changed_item import (
    FeaturesChangedEffectDataChangedItem,
)
from .payment_effect import PaymentEffect
from .payment_effect_data import PaymentEffectData
from .payment_effect_data_payment import PaymentEffectDataPayment
from .plan_changed_effect import PlanChangedEffect
from .plan_changed_effect_data import PlanChangedEffectData
from .replayed_event import ReplayedEvent
from .reversal import Reversal
from .subscription import Subscription
from .subscription_updated_effect import SubscriptionUpdatedEffect
from .subscription_updated_effect_data import SubscriptionUpdatedEffectData
from .usage_page import UsagePage
from .usage_page_usage_item import UsagePageUsageItem
from .usage_reversed_effect import UsageReversedEffect
from .usage_reversed_effect_data import UsageReversedEffectData
from .usage_reversed_effect_data_meter_type_1 import UsageReversedEffectDataMeterType1
from .usage_reversed_effect_data_usage import UsageReversedEffectDataUsage
from .why import Why
from .why_field import WhyField

__all__ = (
    "Account",
    "AccountEvents",
    "AccountEventsEventsItem",
    "AllowanceExhaustedEffect",
    "AllowanceExhaustedEffectData",
    "AllowanceExhaustedEffectDataUsage",
    "AllowanceGrantedEffect",
    "AllowanceGrantedEffectData",
    "AllowanceGrantedEffectDataGrant",
    "BadRequestError",
    "Beaten",
    "CreditBalance",
    "CreditBalanceWhy",
    "CreditDebit",
    "CreditDebitFromGrantsItem",
    "CreditEvent",
    "CreditGrant",
    "CreditGrantTold",
    "Credits",
    "CreditsCrossedEffect",
    "CreditsCrossedEffectData",
    "CreditsEffectData",
    "CreditsExpiredEffect",
    "CreditsExpiredEffectData",
    "CreditsGrantedEffect",
    "CreditsGrantedEffectData",
    "CreditsVoidedEffect",
    "CreditsVoidedEffectData",
    "CustomerDeletedEffect",
    "CustomerDeletedEffectData",
    "Debit",
    "DebitAllocation",
    "DebitAllocationFromGrantsItem",
    "DebitRequest",
    "Effect",
    "EffectAccount",
    "EffectData",
    "EffectSubscriptionState",
    "Error",
    "EventRef",
    "Exhausted",
    "ExhaustedGrantsItem",
    "FeatureCheck",
    "FeatureDecider",
    "Features",
    "FeaturesChangedEffect",
    "FeaturesChangedEffectData",
    "FeaturesChangedEffectDataChangedItem",
    "PaymentEffect",
    "PaymentEffectData",
    "PaymentEffectDataPayment",
    "PlanChangedEffect",
    "PlanChangedEffectData",
    "ReplayedEvent",
    "Reversal",
    "Subscription",
    "SubscriptionUpdatedEffect",
    "SubscriptionUpdatedEffectData",
    "UsagePage",
    "UsagePageUsageItem",
    "UsageReversedEffect",
    "UsageReversedEffectData",
    "UsageReversedEffectDataMeterType1",
    "UsageReversedEffectDataUsage",
    "Why",
    "WhyField",
)
