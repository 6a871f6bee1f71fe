#!/usr/bin/env python3
"""scripts/template-rules.py: the template's parameter checks, evaluated offline.

CloudFormation refuses bad parameters before it creates anything, by each parameter's own
constraints (AllowedPattern, AllowedValues, MinValue/MaxValue, MinLength) and by the
template's Rules. Nothing offline runs them (cfn-lint checks their syntax, an emulator's
CloudFormation ignores Rules), so this evaluates both, as CloudFormation documents them, for
parameter sets that must deploy and for the usual mistakes, each of which must be refused
for its own reason.

    scripts/template-rules.py [template.yaml [docs/openapi.yaml]]

It also checks that every operation of the app API's contract (docs/openapi.yaml) is routed
to the api function with its own throttling: API Gateway answers any other route 404 itself.

Run by scripts/check-template with the pinned tools' Python (it needs PyYAML). Exits 1 when a
good set is refused, a bad set passes, or a bad set is refused for another reason.
"""

import re
import sys

import yaml

# -- the template ----------------------------------------------------------------------------


class Loader(yaml.SafeLoader):
    """YAML with CloudFormation's short forms: !Ref x -> {"Ref": x}, !Sub y -> {"Fn::Sub": y}."""


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {"Fn::" + suffix: value}


Loader.add_multi_constructor("!", _tag)


def load(path):
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=Loader)


# -- parameter constraints -------------------------------------------------------------------


def values_of(spec, raw):
    """What a parameter's value is to its constraints and to Ref: a list for list types."""
    if spec["Type"] == "CommaDelimitedList" or spec["Type"].startswith("List<"):
        return raw.split(",")
    return raw


def constraint_errors(name, spec, raw):
    """Why CloudFormation would refuse this value for this parameter (empty: it would not)."""
    errors = []
    items = values_of(spec, raw)
    items = items if isinstance(items, list) else [items]
    if "AllowedValues" in spec and raw not in [str(v) for v in spec["AllowedValues"]]:
        errors.append(f"{name}: not one of the allowed values")
    # CloudFormation's pattern must match the whole value; for a list, each item.
    if "AllowedPattern" in spec:
        for item in items:
            if not re.fullmatch(spec["AllowedPattern"], item):
                errors.append(f"{name}: {item!r} does not match AllowedPattern")
    if "MinLength" in spec and len(raw) < int(spec["MinLength"]):
        errors.append(f"{name}: shorter than MinLength")
    if "MaxLength" in spec and len(raw) > int(spec["MaxLength"]):
        errors.append(f"{name}: longer than MaxLength")
    if spec["Type"] == "Number":
        try:
            number = float(raw)
        except ValueError:
            return [f"{name}: not a number"]
        if "MinValue" in spec and number < float(spec["MinValue"]):
            errors.append(f"{name}: below MinValue")
        if "MaxValue" in spec and number > float(spec["MaxValue"]):
            errors.append(f"{name}: above MaxValue")
    return errors


# -- rules -----------------------------------------------------------------------------------


class Unsupported(Exception):
    pass


# What CloudFormation accepts inside a rule's RuleCondition and Assertions: Ref and the rule
# functions, no other ("Rule functions", AWS CloudFormation Template Reference,
# docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-rules.html;
# "CloudFormation template Rules syntax", the User Guide's rules-section-structure.html). Any
# other function (Fn::Join, Fn::Sub, Fn::If, Fn::Select, ...) fails the change set when it is
# created, whatever the parameters, and cfn-lint 1.58 does not say so (cfn-lint#3710).
# (Service Catalog's template constraint rules, where Rules come from, also take Fn::If;
# CloudFormation's reference does not list it, so it is refused here.)
RULE_FUNCTIONS = frozenset(
    {
        "Fn::And",
        "Fn::Contains",
        "Fn::EachMemberEquals",
        "Fn::EachMemberIn",
        "Fn::Equals",
        "Fn::Not",
        "Fn::Or",
        "Fn::RefAll",
        "Fn::ValueOf",
        "Fn::ValueOfAll",
    }
)
# "The minimum number of conditions that you can include is two, and the maximum is ten"
# (Fn::And and Fn::Or, the same page).
CONDITIONS_PER_AND_OR = (2, 10)


def rules_syntax_errors(rules):
    """What CloudFormation refuses in the Rules section whatever the parameters: a function
    that is neither Ref nor a rule function, an Fn::And or Fn::Or outside 2..10 conditions."""
    problems = []

    def walk(rule, where, expr):
        if isinstance(expr, list):
            for item in expr:
                walk(rule, where, item)
            return
        if not isinstance(expr, dict):
            return
        for key, arg in expr.items():
            if key == "Ref":
                continue
            if key.startswith("Fn::") or key == "Condition":
                if key not in RULE_FUNCTIONS:
                    problems.append(
                        f"rule {rule}: {key} in its {where} (only Ref and the rule functions "
                        f"are accepted in Rules: {', '.join(sorted(RULE_FUNCTIONS))})"
                    )
                elif key in ("Fn::And", "Fn::Or"):
                    low, high = CONDITIONS_PER_AND_OR
                    if not isinstance(arg, list) or not low <= len(arg) <= high:
                        problems.append(f"rule {rule}: {key} in its {where} takes {low} to {high} conditions")
            walk(rule, where, arg)

    for name, rule in (rules or {}).items():
        if "RuleCondition" in rule:
            walk(name, "RuleCondition", rule["RuleCondition"])
        for assertion in rule.get("Assertions", []):
            walk(name, "Assert", assertion.get("Assert"))
    return problems


def evaluate(expr, params):
    """A rule condition or assertion, with the rule-specific functions CloudFormation has."""
    if isinstance(expr, (str, int, float, bool)):
        return str(expr) if not isinstance(expr, bool) else expr
    if isinstance(expr, list):
        return [evaluate(e, params) for e in expr]
    if not isinstance(expr, dict) or len(expr) != 1:
        raise Unsupported(f"not a function: {expr!r}")
    (fn, arg), = expr.items()
    if fn == "Ref":
        return params[arg]
    if fn == "Fn::Equals":
        a, b = (evaluate(x, params) for x in arg)
        return a == b
    if fn == "Fn::Not":
        (a,) = arg
        return not truth(evaluate(a, params))
    if fn == "Fn::And":
        return all(truth(evaluate(a, params)) for a in arg)
    if fn == "Fn::Or":
        return any(truth(evaluate(a, params)) for a in arg)
    if fn == "Fn::Contains":
        # true when the string is one of the list's members (not a substring test)
        haystack, needle = (evaluate(x, params) for x in arg)
        return needle in haystack
    if fn == "Fn::EachMemberEquals":
        members, value = (evaluate(x, params) for x in arg)
        return all(m == value for m in members)
    if fn == "Fn::EachMemberIn":
        members, allowed = (evaluate(x, params) for x in arg)
        return all(m in allowed for m in members)
    raise Unsupported(f"{fn} is not a rule function this evaluator knows")


def truth(value):
    if not isinstance(value, bool):
        raise Unsupported(f"not a condition: {value!r}")
    return value


def rule_errors(rules, params):
    """The rules that refuse these parameters, as (rule name, its AssertDescription)."""
    refused = []
    for name, rule in rules.items():
        if "RuleCondition" in rule and not truth(evaluate(rule["RuleCondition"], params)):
            continue
        for assertion in rule["Assertions"]:
            if not truth(evaluate(assertion["Assert"], params)):
                refused.append((name, assertion["AssertDescription"]))
    return refused


def check(template, given):
    """Everything CloudFormation would refuse in this parameter set: constraint messages
    and the names of the rules that fail."""
    specs = template["Parameters"]
    unknown = set(given) - set(specs)
    if unknown:
        raise SystemExit(f"template-rules: the set names unknown parameters {sorted(unknown)}")
    missing = [n for n, s in specs.items() if "Default" not in s and n not in given]
    if missing:
        raise SystemExit(f"template-rules: the set lacks required parameters {missing}")
    raw = {n: str(given.get(n, specs[n].get("Default"))) for n in specs}
    problems = []
    for name, spec in specs.items():
        problems += constraint_errors(name, spec, raw[name])
    if problems:
        # CloudFormation checks each value against its parameter before the Rules see it.
        return problems
    params = {n: values_of(specs[n], raw[n]) for n in specs}
    params["AWS::StackName"] = "billing-inbox"
    for name, description in rule_errors(template.get("Rules", {}), params):
        problems.append(f"rule {name}: {' '.join(description.split())}")
    return problems


# -- the parameter sets ----------------------------------------------------------------------

ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:"
# The secrets RDS manages itself, as RDS names them: rds!db-<uuid> for an instance's master
# user, rds!cluster-<uuid> for a cluster's, each with Secrets Manager's 6-character suffix.
RDS_INSTANCE_SECRET = f"{ARN}rds!db-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d-Xy12Ab"
RDS_CLUSTER_SECRET = f"{ARN}rds!cluster-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9-Qw34Er"
# The defaults: DatabaseMode create, the stack makes the database and its network; what a
# first deploy must say (no Default): the sources, the plans, where the alarms go.
REQUIRED = {
    "Sources": '[{"name":"kinde","kind":"kinde","jwks_url":"https://example.kinde.com/.well-known/jwks"}]',
    "PlansSecretArn": "billing-inbox/plans",
    "AlertEmail": "oncall@example.com",
}
EVERYTHING = {
    **REQUIRED,
    "DatabaseMode": "existing",
    "DatabaseSecretArn": f"{ARN}billing-inbox/database-Db7Q2x",
    "DatabaseHost": "billing.cluster-c0ffee.eu-west-1.rds.amazonaws.com",
    "DatabaseName": "billing",
    "DatabaseCaFile": "/opt/global-bundle.pem",
    "DatabaseCaLayerArn": "arn:aws:lambda:eu-west-1:123456789012:layer:rds-ca:3",
    "TracesLayerArn": "arn:aws:lambda:eu-west-1:901920570463:layer:aws-otel-collector-arm64-ver-0-117-0:1",
    "VpcId": "vpc-0123456789abcdef0",
    "RouteTableIds": "rtb-0123456789abcdef0",
    "DatabasePooler": "transaction",
    "DatabaseMigrationHost": "billing.cluster-c0ffee.eu-west-1.rds.amazonaws.com",
    "Sources": '[{"name":"stripe","kind":"stripe","secret_id":"billing-inbox/stripe",'
    '"api_key_secret_id":"billing-inbox/stripe-api-key"},'
    '{"name":"polar","kind":"standard-webhooks","secret_encoding":"raw","secret_id":"billing-inbox/polar"}]',
    "SourceSecretArns": f"{ARN}billing-inbox/stripe-AbC123,{ARN}billing-inbox/polar-??????",
    "SourceApiKeySecretArns": f"{ARN}billing-inbox/stripe-api-key-??????",
    "PlansSecretArn": f"{ARN}billing-inbox/plans-Xy9Zz0",
    "SubnetIds": "subnet-0123456789abcdef0,subnet-0fedcba9876543210",
    "SecurityGroupIds": "sg-0123456789abcdef0",
    "ApiKeysSecretArn": f"{ARN}billing-inbox/api-keys-Qw3rTy",
    "EffectsWebhookUrl": "https://app.example/billing-events",
    "EffectsEventBus": "billing",
    "EffectsEventBusCreate": "true",
    "AlertEmail": "oncall@example.com",
    "AlertHttpsEndpoint": "https://events.pagerduty.com/integration/0123abcd/enqueue",
    "IntakeReservedConcurrency": "20",
    "ApiReservedConcurrency": "5",
    "SourceSilentHours": "0",
    "StripeEventSourceName": "aws.partner/stripe.com/ed_61RBridgeTest0001",
    "StripeEventSourceFor": "stripe",
    "EngineRoomSources": "stripe,polar",
    "EngineRoomSecretArns": f"{ARN}billing-inbox/stripe-AbC123,{ARN}billing-inbox/polar-??????",
    "SecretsKmsKeyArns": "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
}
CREATED = {
    **REQUIRED,
    "Sources": EVERYTHING["Sources"],
    "SourceSecretArns": EVERYTHING["SourceSecretArns"],
    "RdsProxy": "true",
    # the app's webhook is reached through the NAT gateway (rule NoNatNoCallsOut)
    "CreateNatGateway": "true",
    "DatabaseMinCapacity": "0",
    "DatabaseMaxCapacity": "8",
    "EffectsWebhookUrl": "https://app.example/billing-events",
    "EffectsEventBus": "billing",
    "EffectsEventBusCreate": "true",
    "ApiKeysSecretArn": EVERYTHING["ApiKeysSecretArn"],
}
GOOD = {
    "the defaults (Kinde alone, the stack's own database)": REQUIRED,
    "bring your own database with every option": EVERYTHING,
    "the stack's own database with a proxy, effects and the API": CREATED,
    "meter reports with every option": {**EVERYTHING, "MeterReports": "on"},
    "bring your own database without a VPC": {
        **REQUIRED,
        "DatabaseMode": "existing",
        "DatabaseSecretArn": EVERYTHING["DatabaseSecretArn"],
    },
    "bring your own VPC whose endpoints exist": {
        **EVERYTHING,
        "VpcEndpoints": "exist",
        "VpcId": "",
        "RouteTableIds": "",
    },
    "alarms to the topic alone, said so (AlertEmail none)": {**REQUIRED, "AlertEmail": "none"},
    "alarms to an on-call tool alone": {
        **{k: v for k, v in REQUIRED.items() if k != "AlertEmail"},
        "AlertHttpsEndpoint": EVERYTHING["AlertHttpsEndpoint"],
    },
    "RDS's managed secret of an instance (rds!db-...), its endpoint beside it": {
        **REQUIRED,
        "DatabaseMode": "existing",
        "DatabaseSecretArn": RDS_INSTANCE_SECRET,
        "DatabaseHost": "billing.c0ffee.eu-west-1.rds.amazonaws.com",
        "DatabaseName": "billing",
    },
    "RDS's managed secret of a cluster (rds!cluster-...), in the team's VPC": {
        **EVERYTHING,
        "DatabaseSecretArn": RDS_CLUSTER_SECRET,
    },
    "the team's VPC, which reaches S3 through its NAT (RouteTableIds none)": {
        **EVERYTHING,
        "RouteTableIds": "none",
    },
    "a self-hosted database whose certificate nothing verifies (DatabaseTls require)": {
        **REQUIRED,
        "DatabaseMode": "existing",
        "DatabaseSecretArn": EVERYTHING["DatabaseSecretArn"],
        "DatabaseTls": "require",
    },
    "a database of the team's own CA, reached by another name (verify-ca, its bundle)": {
        **EVERYTHING,
        "DatabaseTls": "verify-ca",
    },
    "production: the stack's own database protected from deletion": {
        **CREATED,
        "DatabaseDeletionProtection": "true",
    },
    "no NAT gateway, effects on EventBridge alone, no API key": {
        **REQUIRED, "CreateNatGateway": "false", "EffectsEventBus": "billing", "EffectsEventBusCreate": "true",
    },
    "the least capacity equal to the most": {**CREATED, "DatabaseMinCapacity": "8", "DatabaseMaxCapacity": "8"},
    "a cluster that pauses, at most 1 ACU": {**CREATED, "DatabaseMinCapacity": "0", "DatabaseMaxCapacity": "1"},
    "the console and the admin API behind AWS WAF (ConsoleFirewall on)": {
        **EVERYTHING,
        "ConsoleFirewall": "on",
        "ConsoleRateLimit": "600",
        "ConsoleAnonymousRateLimit": "10",
    },
    "the stack's own database, the console behind AWS WAF at its default limits": {**CREATED, "ConsoleFirewall": "on"},
}
# Each mistake, and what must refuse it: a parameter's constraint or a rule.
BAD = {
    "create mode given an existing database's secret": (
        {**CREATED, "DatabaseSecretArn": EVERYTHING["DatabaseSecretArn"]},
        "rule CreateModeMakesItsOwn:",
    ),
    "create mode given the team's subnets": (
        {**CREATED, "SubnetIds": EVERYTHING["SubnetIds"], "SecurityGroupIds": EVERYTHING["SecurityGroupIds"]},
        "rule CreateModeMakesItsOwn:",
    ),
    "existing mode without the database's secret": (
        {**EVERYTHING, "DatabaseSecretArn": ""},
        "rule ExistingModeNeedsSecret:",
    ),
    "endpoints to create in the team's VPC without its id": (
        {**EVERYTHING, "VpcId": ""},
        "rule EndpointsNeedVpcId:",
    ),
    "a route table given by name": (
        {**EVERYTHING, "RouteTableIds": "private"},
        "RouteTableIds:",
    ),
    "create mode told of a pooler of its own": (
        {**CREATED, "DatabasePooler": "transaction"},
        "rule CreateModeMakesItsOwn:",
    ),
    "an unknown database mode": (
        {**REQUIRED, "DatabaseMode": "serverless"},
        "DatabaseMode:",
    ),
    "the database's secret by name (refused in every role's policy)": (
        {**EVERYTHING, "DatabaseSecretArn": "billing-inbox/database"},
        "DatabaseSecretArn:",
    ),
    "the database's secret as a partial ARN": (
        {**EVERYTHING, "DatabaseSecretArn": f"{ARN}billing-inbox/database"},
        "DatabaseSecretArn:",
    ),
    "source secrets given by name": (
        {**EVERYTHING, "SourceSecretArns": "billing-inbox/stripe,billing-inbox/polar"},
        "SourceSecretArns:",
    ),
    "a source secret's ARN without its suffix": (
        {**EVERYTHING, "SourceSecretArns": f"{ARN}billing-inbox/stripe"},
        "SourceSecretArns:",
    ),
    "an API key secret given by name": (
        {**EVERYTHING, "SourceApiKeySecretArns": "billing-inbox/stripe-api-key"},
        "SourceApiKeySecretArns:",
    ),
    "an API key secret's ARN without its suffix": (
        {**EVERYTHING, "SourceApiKeySecretArns": f"{ARN}billing-inbox/stripe-api-key"},
        "SourceApiKeySecretArns:",
    ),
    "subnets without security groups": (
        {**EVERYTHING, "SecurityGroupIds": ""},
        "rule SubnetsNeedSecurityGroups:",
    ),
    "security groups without subnets": (
        {**EVERYTHING, "SubnetIds": ""},
        "rule SecurityGroupsNeedSubnets:",
    ),
    "a subnet given by name": (
        {**EVERYTHING, "SubnetIds": "private-a"},
        "SubnetIds: 'private-a' does not match AllowedPattern",
    ),
    "the API keys' secret by name (refused in the api role's policy)": (
        {**EVERYTHING, "ApiKeysSecretArn": "billing-inbox/api-keys"},
        "ApiKeysSecretArn: 'billing-inbox/api-keys' does not match AllowedPattern",
    ),
    "the API keys' secret with a wildcard suffix (not found by GetSecretValue)": (
        {**EVERYTHING, "ApiKeysSecretArn": f"{ARN}billing-inbox/api-keys-??????"},
        "ApiKeysSecretArn:",
    ),
    "the plans' secret as a partial ARN": (
        {**EVERYTHING, "PlansSecretArn": f"{ARN}billing-inbox/plans"},
        "PlansSecretArn:",
    ),
    "meter reports without an API key secret to send with": (
        {**EVERYTHING, "MeterReports": "on", "SourceApiKeySecretArns": ""},
        "rule MeterReportsNeedApiKeys:",
    ),
    "a bus to create without its name": (
        {**EVERYTHING, "EffectsEventBus": ""},
        "rule EffectsBusCreateNeedsBus:",
    ),
    "a KMS key by its alias": (
        {**EVERYTHING, "SecretsKmsKeyArns": "alias/billing"},
        "SecretsKmsKeyArns:",
    ),
    "no NAT gateway, and meter reports to send": (
        {**REQUIRED, "CreateNatGateway": "false", "MeterReports": "on", "SourceApiKeySecretArns": EVERYTHING["SourceApiKeySecretArns"]},
        "rule NoNatNoCallsOut:",
    ),
    "no NAT gateway, and a provider API key to read with": (
        {**REQUIRED, "CreateNatGateway": "false", "SourceApiKeySecretArns": EVERYTHING["SourceApiKeySecretArns"]},
        "rule NoNatNoCallsOut:",
    ),
    "no NAT gateway, and an effects webhook": (
        {**REQUIRED, "CreateNatGateway": "false", "EffectsWebhookUrl": EVERYTHING["EffectsWebhookUrl"]},
        "rule NoNatNoCallsOut:",
    ),
    "an effects endpoint over plain http": (
        {**EVERYTHING, "EffectsWebhookUrl": "http://app.example/billing-events"},
        "EffectsWebhookUrl:",
    ),
    "sources past what every function's 4 KB environment can carry": (
        {**EVERYTHING, "Sources": "[" + ",".join(['{"name":"s%03d","kind":"kinde","jwks_url":"https://example.kinde.com/.well-known/jwks"}' % i for i in range(25)]) + "]"},
        "Sources: longer than MaxLength",
    ),
    "an alert endpoint over plain http": (
        {**EVERYTHING, "AlertHttpsEndpoint": "http://events.pagerduty.com/integration/x/enqueue"},
        "AlertHttpsEndpoint:",
    ),
    "a partner event source without the source it feeds": (
        {**EVERYTHING, "StripeEventSourceFor": ""},
        "rule StripeEventSourceNeedsItsSource:",
    ),
    "a source to feed without its partner event source": (
        {**EVERYTHING, "StripeEventSourceName": ""},
        "rule StripeSourceNeedsItsEventSource:",
    ),
    "another partner's event source": (
        {**EVERYTHING, "StripeEventSourceName": "aws.partner/example.com/ed_1"},
        "StripeEventSourceName:",
    ),
    "a negative reservation": (
        {**EVERYTHING, "IntakeReservedConcurrency": "-1"},
        "IntakeReservedConcurrency: below MinValue",
    ),
    "alarms to nobody, unsaid (AlertEmail and AlertHttpsEndpoint empty)": (
        {**REQUIRED, "AlertEmail": ""},
        "rule AlarmsNeedADestination:",
    ),
    "RDS's managed secret by its name": (
        {**EVERYTHING, "DatabaseSecretArn": "rds!db-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"},
        "DatabaseSecretArn:",
    ),
    "RDS's managed secret's ARN without its suffix": (
        {**EVERYTHING, "DatabaseSecretArn": RDS_CLUSTER_SECRET[: -len("-Qw34Er")]},
        "DatabaseSecretArn:",
    ),
    "endpoints in the team's VPC and no route tables (the migration could not answer)": (
        {**EVERYTHING, "RouteTableIds": ""},
        "rule EndpointsNeedRouteTables:",
    ),
    "route tables and none together": (
        {**EVERYTHING, "RouteTableIds": "rtb-0123456789abcdef0,none"},
        "rule EndpointsNeedRouteTables:",
    ),
    "a least capacity over the most": (
        {**CREATED, "DatabaseMinCapacity": "8", "DatabaseMaxCapacity": "4"},
        "rule CapacityLeastUpToMost:",
    ),
    "a least capacity of 2 under a most of 1": (
        {**CREATED, "DatabaseMinCapacity": "2", "DatabaseMaxCapacity": "1"},
        "rule CapacityLeastUpToMost:",
    ),
    "a capacity off the ladder": (
        {**CREATED, "DatabaseMinCapacity": "1.5"},
        "DatabaseMinCapacity: not one of the allowed values",
    ),
    "create mode with the database's TLS relaxed": (
        {**CREATED, "DatabaseTls": "require"},
        "rule CreateModeMakesItsOwn:",
    ),
    "create mode given a database name and port of its own": (
        {**CREATED, "DatabaseName": "billing", "DatabasePort": "6432"},
        "rule CreateModeMakesItsOwn:",
    ),
    "a CA bundle that nothing checks (DatabaseTls require)": (
        {**EVERYTHING, "DatabaseTls": "require"},
        "rule CaBundleVerifies:",
    ),
    "a CA bundle without the layer that carries it": (
        {**EVERYTHING, "DatabaseCaLayerArn": ""},
        "rule CaBundleInItsLayer:",
    ),
    "a CA layer without the bundle's path": (
        {**EVERYTHING, "DatabaseCaFile": ""},
        "rule CaBundleInItsLayer:",
    ),
    "an unknown TLS mode": (
        {**EVERYTHING, "DatabaseTls": "prefer"},
        "DatabaseTls: not one of the allowed values",
    ),
    "RDS Proxy asked of existing mode": (
        {**EVERYTHING, "RdsProxy": "true"},
        "rule ExistingModeCreatesNoDatabase:",
    ),
    "deletion protection for a database the stack does not make": (
        {**EVERYTHING, "DatabaseDeletionProtection": "true"},
        "rule ExistingModeCreatesNoDatabase:",
    ),
    "an Engine Room without the app API": (
        {**REQUIRED, "EngineRoomSources": "stripe"},
        "rule EngineRoomNeedsTheApi:",
    ),
    "the Engine Room's secrets without its sources": (
        {**EVERYTHING, "EngineRoomSources": ""},
        "rule EngineRoomSecretsNeedItsSources:",
    ),
    "the Engine Room's sources with a space": (
        {**EVERYTHING, "EngineRoomSources": "stripe, polar"},
        "EngineRoomSources:",
    ),
    "the Engine Room's secret by its name": (
        {**EVERYTHING, "EngineRoomSecretArns": "billing-inbox/stripe"},
        "EngineRoomSecretArns:",
    ),
    "the console behind AWS WAF without the app API": (
        {**REQUIRED, "ConsoleFirewall": "on"},
        "rule ConsoleFirewallNeedsTheApi:",
    ),
    "a rate limit AWS WAF refuses (under 10 requests in 5 minutes)": (
        {**EVERYTHING, "ConsoleFirewall": "on", "ConsoleAnonymousRateLimit": "5"},
        "ConsoleAnonymousRateLimit: below MinValue",
    ),
    "a partner event source's name over 256 characters": (
        {**EVERYTHING, "StripeEventSourceName": "aws.partner/stripe.com/ed_" + "1" * 240},
        "StripeEventSourceName: longer than MaxLength",
    ),
}


# -- the app API's routes --------------------------------------------------------------------

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def routes_of_body(paths, condition):
    """The routes an API's OpenAPI body writes under `condition` (each path item `Fn::If`)."""
    routes = {}
    for path, item in paths.items():
        if isinstance(item, dict) and "Fn::If" in item:
            if item["Fn::If"][0] != condition:
                continue
            item = item["Fn::If"][1]
        for method in item:
            routes[f"{method.upper()} {path}"] = item[method]
    return routes


def route_errors(template, openapi):
    """Each operation of docs/openapi.yaml is routed to the api function and has its own
    throttling in RouteSettings: any other route API Gateway answers 404 itself, without
    invoking the function (a route served in tests and refused once deployed).

    The app's routes are HttpApi events of the api function, throttled whatever
    ConsoleFirewall says; the admin API's and the console's are routes of HttpApi's body
    under ConsoleOnHttpApi, throttled there, and with ConsoleFirewall on, routes of
    ConsoleApi's body (its web ACL limits them) and none of the HTTP API's."""
    resources = template["Resources"]
    events = resources["ApiFunction"]["Properties"]["Events"].values()
    app_routes = {
        f'{e["Properties"]["Method"].upper()} {e["Properties"]["Path"]}'
        for e in events
        if e.get("Type") == "HttpApi"
    }
    http_body = resources["HttpApi"]["Properties"]["DefinitionBody"]["paths"]
    console_routes = set(routes_of_body(http_body, "ConsoleOnHttpApi"))
    settings = resources["HttpApi"]["Properties"]["RouteSettings"]["Fn::If"]
    problems = []
    if settings[0] != "ConsoleOnHttpApi":
        return ["HttpApi's RouteSettings: Fn::If on ConsoleOnHttpApi first"]
    throttled = set(settings[1])
    # ConsoleFirewall on, with the app API: a route setting on a route the API does not have
    # fails the deploy, and every app route keeps its own.
    with_api = settings[2]["Fn::If"]
    throttled_firewall_on = set(with_api[1]) if with_api[0] == "HasApi" else set()
    for route in sorted(throttled_firewall_on - app_routes - {"POST /webhooks/{source}"}):
        problems.append(f"{route} has RouteSettings with ConsoleFirewall on, where the HTTP API has no such route")
    for route in sorted(app_routes - throttled_firewall_on):
        problems.append(f"{route} has no RouteSettings of its own with ConsoleFirewall on")
    for route in sorted(app_routes & console_routes):
        problems.append(f"{route} is both an event of ApiFunction and a route of HttpApi's body")
    for route in sorted(app_routes):
        if route.split(" ", 1)[1].startswith(("/v1/admin", "/console")):
            problems.append(f"{route} is an HttpApi event of ApiFunction: it would stay on the HTTP API with ConsoleFirewall on")
    routed = app_routes | console_routes
    for path, item in openapi["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            route = f"{method.upper()} {path}"
            if route not in routed:
                problems.append(f"{route} (docs/openapi.yaml) is no route of the api function on the HTTP API")
            if route not in throttled:
                problems.append(f"{route} has no RouteSettings of its own")
    documented = {f"{m.upper()} {p}" for p, i in openapi["paths"].items() for m in METHODS if m in i}
    for route in sorted(routed - documented):
        # The console's pages are HTML, not the API's contract; they are throttled all the same.
        if route.split(" ", 1)[1].startswith("/console"):
            if route not in throttled:
                problems.append(f"{route} has no RouteSettings of its own")
            continue
        problems.append(f"{route} is routed but not in docs/openapi.yaml")
    # ConsoleFirewall on: the REST API serves every admin and console route the HTTP API did.
    rest = routes_of_body(resources["ConsoleApi"]["Properties"]["DefinitionBody"]["paths"], None)
    for route in sorted(console_routes):
        method, path = route.split(" ", 1)
        served = (
            route in rest
            or (path.startswith("/console/") and "GET /console/{proxy+}" in rest)
            or (path.startswith("/v1/admin/") and "X-AMAZON-APIGATEWAY-ANY-METHOD /v1/admin/{proxy+}" in rest)
        )
        if not served:
            problems.append(f"{route} is not served by ConsoleApi (ConsoleFirewall on)")
    return problems


# -- names the template builds -----------------------------------------------------------------

# The longest stack name CloudFormation takes (128 characters, "[a-zA-Z][-a-zA-Z0-9]*"; the
# Stack name quota, "Understand CloudFormation quotas", User Guide cloudformation-limits.html),
# with the '--' some names refuse; the longest Region code and its stack id.
WORST_STACK_NAME = "b--" + "x" * 125
WORST_REGION = "ap-southeast-7"
WORST_STACK_ID = (
    f"arn:aws:cloudformation:{WORST_REGION}:123456789012:stack/{WORST_STACK_NAME}/"
    "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
)
PSEUDO = {
    "AWS::StackName": WORST_STACK_NAME,
    "AWS::StackId": WORST_STACK_ID,
    "AWS::Region": WORST_REGION,
    "AWS::AccountId": "123456789012",
    "AWS::Partition": "aws-us-gov",
    "AWS::URLSuffix": "amazonaws.com.cn",
}
# Each name a resource's property gives, its longest and its form, from the page that says so.
NAME_LIMITS = {
    ("AWS::RDS::DBProxy", "DBProxyName"): (
        63,
        r"[A-Za-z](?!.*--)[A-Za-z0-9-]*[A-Za-z0-9]",
        "AWS::RDS::DBProxy DBProxyName: 1 to 63 letters, digits or hyphens, a letter first, "
        "no hyphen last, no two hyphens together (CloudFormation's AWS::RDS::DBProxy reference)",
    ),
    ("AWS::Logs::LogGroup", "LogGroupName"): (
        512,
        r"[.\-_/#A-Za-z0-9]+",
        "log group names: 1 to 512 of a-z A-Z 0-9 _ - / . # (CloudWatch Logs CreateLogGroup API reference)",
    ),
    ("AWS::Logs::MetricFilter", "MetricNamespace"): (
        255,
        r"[^:*$]+",
        "metric namespaces: at most 255 characters, no ':', '*' or '$' (CloudWatch Logs MetricTransformation API reference)",
    ),
    ("AWS::Events::EventBus", "Name"): (
        256,
        r"(aws\.partner/[.\-_A-Za-z0-9/]+|[/.\-_A-Za-z0-9]+)",
        "event bus names: at most 256 of a-z A-Z 0-9 . - _ / (EventBridge CreateEventBus API reference)",
    ),
    ("AWS::SQS::Queue", "QueueName"): (
        80,
        r"[A-Za-z0-9_-]+(\.fifo)?",
        "queue names: 1 to 80 of a-z A-Z 0-9 - _ (SQS CreateQueue API reference)",
    ),
    ("AWS::Lambda::Function", "FunctionName"): (
        64,
        r"[A-Za-z0-9_-]+",
        "function names: 1 to 64 of a-z A-Z 0-9 - _ (Lambda CreateFunction API reference)",
    ),
    ("AWS::IAM::Role", "RoleName"): (
        64,
        r"[\w+=,.@-]+",
        "role names: 1 to 64 (IAM CreateRole API reference)",
    ),
}


class NotStatic(Exception):
    pass


def worst_value(expr, specs):
    """The longest text an expression can give: pseudo parameters at their worst, a parameter
    at its MaxLength (CloudFormation's 4,096 bytes when it has none, the Parameter value quota).
    NotStatic for what only the deploy knows (a GetAtt, a resource's Ref)."""
    if isinstance(expr, (str, int, float)):
        return str(expr)
    if isinstance(expr, dict) and len(expr) == 1:
        (fn, arg), = expr.items()
        if fn == "Ref":
            if arg in PSEUDO:
                return PSEUDO[arg]
            if arg in specs:
                spec = specs[arg]
                return "x" * int(spec.get("MaxLength", 4096))
            raise NotStatic(arg)
        if fn == "Fn::Sub":
            text, variables = (arg, {}) if isinstance(arg, str) else arg
            values = {k: worst_value(v, specs) for k, v in variables.items()}

            def swap(m):
                name = m.group(1)
                if name in values:
                    return values[name]
                return worst_value({"Ref": name}, specs)

            return re.sub(r"\$\{([^!}][^}]*)\}", swap, text)
        if fn == "Fn::Join":
            sep, items = arg
            return sep.join(worst_value(i, specs) for i in items)
        if fn == "Fn::Select":
            index, items = arg
            return worst_list(items, specs)[int(index)]
    raise NotStatic(repr(expr))


def worst_list(expr, specs):
    if isinstance(expr, list):
        return [worst_value(e, specs) for e in expr]
    if isinstance(expr, dict) and set(expr) == {"Fn::Split"}:
        sep, text = expr["Fn::Split"]
        return worst_value(text, specs).split(sep)
    raise NotStatic(repr(expr))


def name_errors(template):
    """Each name the template builds that the worst stack name, Region or parameter would
    push past its resource's limit or out of its form (the deploy fails there, after what
    came before it was made: a DBProxy named after a 61-character stack failed after the
    cluster existed)."""
    specs = template["Parameters"]
    problems = []
    for lid, resource in template["Resources"].items():
        for (type_, prop), (longest, form, source) in NAME_LIMITS.items():
            if resource.get("Type") != type_ or prop not in resource.get("Properties", {}):
                continue
            try:
                value = worst_value(resource["Properties"][prop], specs)
            except NotStatic:
                continue  # a resource's id or attribute: AWS made it, within its own limits
            if len(value) > longest or not re.fullmatch(form, value):
                problems.append(f"{lid}.{prop} can be {value[:80]!r}... ({len(value)} characters): {source}")
    return problems


# -- the template's own quotas ---------------------------------------------------------------

# "Understand CloudFormation quotas" (User Guide, cloudformation-limits.html): the template as
# `sam deploy` uploads it to S3 and as the SAM transform expands it (scripts/template-stack.py
# counts the expanded resources per parameter set).
TEMPLATE_QUOTAS = {
    "template body in S3 (bytes)": 1_048_576,
    "parameters": 200,
    "outputs": 200,
    "resources": 500,
    "description (bytes)": 1024,
}


def quota_errors(path, template):
    counts = {
        "template body in S3 (bytes)": len(open(path, "rb").read()),
        "parameters": len(template.get("Parameters", {})),
        "outputs": len(template.get("Outputs", {})),
        "resources": len(template.get("Resources", {})),
        "description (bytes)": len(str(template.get("Description", "")).encode()),
    }
    return [
        f"{what}: {counts[what]}, over CloudFormation's {limit}"
        for what, limit in TEMPLATE_QUOTAS.items()
        if counts[what] > limit
    ]


# Functions CloudFormation refuses in Rules, each put in a rule of its own that must be
# refused: the check above must never come to allow one of them (as this script's evaluator
# once evaluated Fn::Join, and the template shipped a rule no account could create).
NOT_RULE_FUNCTIONS = {
    "Fn::Join": ["", {"Ref": "EngineRoomSecretArns"}],
    "Fn::Sub": "${EngineRoomSources}",
    "Fn::If": ["HasSourceSecrets", "a", "b"],
    "Fn::Select": ["0", {"Ref": "SubnetIds"}],
    "Fn::Split": [",", {"Ref": "EngineRoomSources"}],
    "Fn::GetAtt": ["Queue", "Arn"],
    "Fn::FindInMap": ["Map", "Key", "Value"],
    "Fn::Base64": "x",
    "Fn::ImportValue": "exported",
    "Fn::GetAZs": "",
    "Fn::Length": [{"Ref": "SubnetIds"}],
    "Fn::ToJsonString": {"Ref": "Sources"},
    "Fn::Cidr": ["10.0.0.0/16", "2", "8"],
    "Condition": "HasSourceSecrets",
}


def refused_functions_selftest():
    """Each function CloudFormation refuses in Rules fails the check, in a rule's condition
    and in an assertion, nested as deep as the template nests its own; each rule function
    passes. Returns the number of failures."""
    failures = 0
    for fn, arg in NOT_RULE_FUNCTIONS.items():
        inner = {"Fn::Equals": [{fn: arg}, ""]}
        for where, rule in (
            ("RuleCondition", {"RuleCondition": {"Fn::Not": [inner]}, "Assertions": [{"Assert": {"Fn::Equals": ["a", "a"]}, "AssertDescription": "x"}]}),
            ("Assert", {"Assertions": [{"Assert": {"Fn::Or": [inner, {"Fn::Equals": ["a", "b"]}]}, "AssertDescription": "x"}]}),
        ):
            problems = rules_syntax_errors({"Probe": rule})
            if not any(fn in p and where in p for p in problems):
                print(f"FAIL  the Rules check let {fn} through in a {where}: {problems}")
                failures += 1
    allowed = {
        "Fn::And": [{"Fn::Equals": ["a", "a"]}, {"Fn::Contains": [["a"], {"Ref": "DatabaseMode"}]}],
        "Fn::EachMemberEquals": [{"Ref": "SubnetIds"}, ""],
        "Fn::EachMemberIn": [{"Fn::ValueOfAll": ["AWS::EC2::Subnet::Id", "VpcId"]}, {"Fn::RefAll": "AWS::EC2::VPC::Id"}],
        "Fn::Not": [{"Fn::Equals": [{"Fn::ValueOf": ["SubnetIds", "VpcId"]}, ""]}],
    }
    problems = rules_syntax_errors({"Probe": {"Assertions": [{"Assert": {"Fn::Or": [{k: v} for k, v in allowed.items()]}, "AssertDescription": "x"}]}})
    if problems:
        print(f"FAIL  the Rules check refused rule functions: {problems}")
        failures += 1
    for count in (1, 11):
        problems = rules_syntax_errors({"Probe": {"Assertions": [{"Assert": {"Fn::And": [{"Fn::Equals": ["a", "a"]}] * count}, "AssertDescription": "x"}]}})
        if not problems:
            print(f"FAIL  the Rules check took an Fn::And of {count} conditions")
            failures += 1
    if not failures:
        print(f"ok    Rules: only Ref and the rule functions ({len(NOT_RULE_FUNCTIONS)} other functions refused, each as a condition and an assertion)")
    return failures


def names_selftest(template):
    """The name check refuses what AWS refuses: the stack-named proxy of the release before
    (over 63 characters, and '--'), a log group name with a space."""
    failures = 0
    probes = {
        "a proxy named after the stack": ("AWS::RDS::DBProxy", "DBProxyName", {"Fn::Sub": "${AWS::StackName}-db"}),
        "a log group with a space": ("AWS::Logs::LogGroup", "LogGroupName", {"Fn::Sub": "/aws/lambda/${AWS::StackName} x"}),
    }
    for label, (type_, prop, value) in probes.items():
        probe = {"Parameters": template["Parameters"], "Resources": {"Probe": {"Type": type_, "Properties": {prop: value}}}}
        if not name_errors(probe):
            print(f"FAIL  the name check took {label}")
            failures += 1
    if not failures:
        print(f"ok    names: {len(NAME_LIMITS)} kinds of name checked at a 128-character stack name with '--' ({len(probes)} bad names refused)")
    return failures


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    template = load(path)
    failures = 0
    openapi_path = sys.argv[2] if len(sys.argv) > 2 else "docs/openapi.yaml"
    with open(openapi_path, encoding="utf-8") as f:
        openapi = yaml.safe_load(f)
    for problem in route_errors(template, openapi):
        print(f"FAIL  route: {problem}")
        failures += 1
    for name, spec in template["Parameters"].items():
        if "Default" in spec:
            for problem in constraint_errors(name, spec, str(spec["Default"])):
                print(f"FAIL  default of {name} refused by its own constraints: {problem}")
                failures += 1
    failures += refused_functions_selftest()
    for problem in quota_errors(path, template):
        print(f"FAIL  quota: {problem}")
        failures += 1
    for problem in name_errors(template):
        print(f"FAIL  name: {problem}")
        failures += 1
    failures += names_selftest(template)
    refused = rules_syntax_errors(template.get("Rules", {}))
    for problem in refused:
        print(f"FAIL  {problem}")
    if refused:
        # the parameter sets cannot be evaluated, and CloudFormation would refuse every one
        print(f"template-rules: {len(refused)} refused in Rules; CloudFormation creates no stack from this template")
        sys.exit(1)
    for rule, body in template.get("Rules", {}).items():
        for assertion in body["Assertions"]:
            if not assertion.get("AssertDescription", "").strip():
                print(f"FAIL  rule {rule}: an assertion without AssertDescription")
                failures += 1
    def checked(given):
        try:
            return check(template, given)
        except SystemExit as e:  # a set naming a parameter the template lacks
            return [str(e)]

    for label, given in GOOD.items():
        problems = checked(given)
        if problems:
            print(f"FAIL  {label}: refused: {problems}")
            failures += 1
        else:
            print(f"ok    {label}: accepted")
    for label, (given, expected) in BAD.items():
        problems = checked(given)
        # refused, and only for the reason this mistake is about
        if problems and all(p.startswith(expected) for p in problems):
            print(f"ok    {label}: refused ({'; '.join(problems)})")
        else:
            print(f"FAIL  {label}: expected refusals starting {expected!r} alone, got {problems}")
            failures += 1
    if failures:
        print(f"template-rules: {failures} failed")
        sys.exit(1)
    print(f"template-rules: ok ({len(GOOD)} sets accepted, {len(BAD)} refused as expected)")


if __name__ == "__main__":
    main()
