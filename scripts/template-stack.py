#!/usr/bin/env python3
"""scripts/template-stack.py: the template, transformed and created in an emulator, offline.

cfn-lint and sam validate read the template; nothing offline creates it. This does, for
each parameter set below: the SAM transform (samtranslator, as sam validate runs it, with
the functions' CodeUri made the S3 location `sam package` would write), then a stack in
moto's CloudFormation (in-process, us-east-1, fake credentials, no network), and checks
what was made:

* the stack is CREATE_COMPLETE and every resource of the transformed template is listed
  CREATE_COMPLETE with a physical id (NO_PHYSICAL_ID: the types moto lists without one);
* the objects are there with the template's settings: the queues (visibility timeout,
  retention, encryption, redrive policy to the stack's own DLQ; each attribute inside the
  range SQS documents, which moto does not hold), the functions (role,
  timeout, memory, description, VPC, reserved concurrency, and exactly the variables the
  template gives, none of them empty or an unresolved `{"Ref": ...}`, `${...}` or
  `{{resolve:...}}`), the roles' inline policies (every Resource an ARN, or "*" for EC2's
  unscoped actions), the log groups' names and retention, the topic, the bus, the schedule
  rule and its target, the event source mappings (queue, batch, concurrency, each inside
  Lambda's documented range for SQS), the invoke
  permissions, a security group's ingress rule, a DB subnet group. The function properties
  moto does not pass on (LAMBDA_IGNORED: architectures, layers, logging) are checked to
  resolve to parameters and created resources instead;
* every output resolves to a non-empty string with no unresolved token; an output that
  names a resource moto cannot create (DROP below) must carry that resource's placeholder;
* the resources that CloudFormation could not delete (DELETE_BLOCKERS: a deletion protection
  on) are exactly the set's "protected" (none by default): a first deploy that fails must
  roll back, not stop in ROLLBACK_FAILED with a cluster nobody can delete but by hand.

What moto cannot do is done here first, as CloudFormation would: the parameter constraints
and Rules (scripts/template-rules.py, which moto ignores), the Conditions, Fn::If and
AWS::NoValue (moto keeps a None where an Fn::If in a list yields NoValue), the
{{resolve:secretsmanager:...}} dynamic references (read from the secrets the set says
exist, created in moto first). Resource types moto has no model for are dropped, each with
its reason in DROP; a Ref, GetAtt or ${} to one becomes the placeholder DROPPED-<LogicalId>
(DROPPED-<LogicalId>.<Attribute> for an attribute) so that the rest is still created. A type
neither modelled by moto nor listed in DROP fails the run: add it to DROP, with the reason,
or upgrade moto.

    scripts/template-stack.py [template.yaml]

Run by scripts/check-template with the moto tool set's Python (moto, boto3 and the SAM
translator pinned in scripts/tools/moto.txt). Prints one line per parameter set; exits 1
when a set fails, with what failed.

To add a parameter set: an entry in SETS, its "params" the values as `sam deploy
--parameter-overrides` would give them (a list parameter as one comma-separated string), where
`{net:NAME}` for the id of the team's VPC, subnets, route tables or security group
(team_network), and `{arn:NAME}` for the ARN of the existing secret NAME (created in moto from
EXISTING_SECRETS before the stack, so the roles' policies and the dynamic references name a
real secret; add a secret there when a set needs another). The set must be one the
parameters' constraints and Rules accept. An entry with "needs" runs only when the template
has all those parameters, and is skipped with a note until then. "protected" lists the
resources the set makes that CloudFormation could not delete (none when absent); "outputs"
maps an output to the texts its value must hold.
"""

import ast
import copy
import importlib.util
import io
import json
import logging
import os
import re
import sys
import time
import ipaddress
import itertools
import warnings
import zipfile
from pathlib import Path

# Offline and in-process whatever the caller's environment: no endpoint (scripts/stack.sh
# exports AWS_ENDPOINT_URL for the local moto_server, which would take the calls away from
# the in-process mock), no profile, fake credentials, one region.
for _name in list(os.environ):
    if _name.startswith("AWS_ENDPOINT_URL") or _name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        del os.environ[_name]
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_SESSION_TOKEN="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
    AWS_CONFIG_FILE="/dev/null",
    AWS_SHARED_CREDENTIALS_FILE="/dev/null",
)

import boto3  # noqa: E402
from moto import mock_aws  # noqa: E402
from moto.cloudformation.parsing import get_model_map  # noqa: E402
from samtranslator.parser.parser import Parser  # noqa: E402
from samtranslator.public.exceptions import InvalidDocumentException  # noqa: E402
from samtranslator.translator.translator import Translator  # noqa: E402

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
STACK = "billing-inbox"
CODE_BUCKET = "billing-inbox-artifacts"
CODE_KEY = "placeholder.zip"

# -- the parameter sets ----------------------------------------------------------------------

# The secrets a deploy expects to exist already (the operator's), with a value of their shape.
EXISTING_SECRETS = {
    "billing-inbox/database": '{"username":"inbox","password":"pw","host":"db.internal","port":5432,"dbname":"inbox"}',
    "billing-inbox/plans": '{"plans":[]}',
    "billing-inbox/stripe": '{"secrets":["whsec_x"]}',
    "billing-inbox/stripe-api-key": '{"api_key":"rk_test_x"}',
    "billing-inbox/polar": '{"secrets":["x"]}',
    "billing-inbox/api-keys": '[{"name":"app","sha256":"00","scopes":["read"]}]',
    # What RDS keeps for a cluster's master user, under the name RDS gives it.
    "rds!cluster-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9": '{"username":"postgres","password":"pw"}',
}

KINDE = '[{"name":"kinde","kind":"kinde","jwks_url":"https://example.kinde.com/.well-known/jwks"}]'
SETS = {
    # (a) the parameters without a Default, nothing else: the stack's own database
    "defaults": {
        "params": {
            "Sources": KINDE,
            "PlansSecretArn": "billing-inbox/plans",
            "AlertEmail": "oncall@example.com",
        },
        # A first deploy: everything it creates, CloudFormation can delete on a rollback.
        "protected": [],
        "outputs": {
            "AlarmDestinations": ["e-mail to oncall@example.com"],
            "LogGroups": [f"/aws/lambda/{STACK}/{f}" for f in ("intake", "worker", "scheduler", "migrate")],
            "AccessLogGroup": [f"/aws/vendedlogs/apigateway/{STACK}/access"],
        },
    },
    # (b) an existing database and network, every option on
    "bring-your-own, every option": {
        "params": {
            "DatabaseMode": "existing",
            "DatabaseSecretArn": "{arn:billing-inbox/database}",
            "VpcEndpoints": "create",
            "VpcId": "{net:vpc}",
            "RouteTableIds": "{net:rtb-a},{net:rtb-b}",
            "DatabaseHost": "inbox-pgbouncer.internal.example",
            "DatabasePooler": "transaction",
            "DatabaseMigrationHost": "inbox.cluster-abc.us-east-1.rds.amazonaws.com",
            "DatabasePort": "6432",
            "DatabaseName": "inbox",
            "DatabaseCaFile": "/opt/global-bundle.pem",
            "DatabaseCaLayerArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:layer:rds-ca:3",
            "TracesLayerArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:layer:aws-otel-collector-arm64-ver-0-117-0:1",
            "Sources": '[{"name":"stripe","kind":"stripe","secret_id":"billing-inbox/stripe",'
            '"api_key_secret_id":"billing-inbox/stripe-api-key"},'
            '{"name":"polar","kind":"standard-webhooks","secret_encoding":"raw","secret_id":"billing-inbox/polar"}]',
            "SourceSecretArns": "{arn:billing-inbox/stripe},"
            f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:billing-inbox/polar-??????",
            "SourceApiKeySecretArns": "{arn:billing-inbox/stripe-api-key}",
            "WorkerProviderReads": "true",
            "PlansSecretArn": "{arn:billing-inbox/plans}",
            "ConfigRevision": "2026-12-02",
            "ToleranceSecs": "600",
            "RetentionDays": "90",
            "ScheduleRate": "rate(2 minutes)",
            "WorkerMaxConcurrency": "5",
            "IntakeReservedConcurrency": "20",
            "BacklogAgeAlarmSeconds": "1800",
            "AlertEmail": "oncall@example.com",
            "AlertHttpsEndpoint": "https://events.pagerduty.com/integration/0123abcd/enqueue",
            "RejectedDeliveriesAlarmThreshold": "10",
            "SourceSilentHours": "12",
            "SubnetIds": "{net:subnet-a},{net:subnet-b}",
            "SecurityGroupIds": "{net:sg}",
            "EffectsWebhookUrl": "https://app.example/billing-events",
            "EffectsEventBus": "billing",
            "EffectsEventBusCreate": "true",
            "DispatcherMaxConcurrency": "4",
            "ApiKeysSecretArn": "{arn:billing-inbox/api-keys}",
            "ApiThrottleRate": "20",
            "ApiThrottleBurst": "40",
            "WebhookThrottleRate": "200",
            "WebhookThrottleBurst": "400",
            "ApiReservedConcurrency": "5",
            "LogRetentionDays": "90",
            "StripeEventSourceName": "aws.partner/stripe.com/ed_61RBridgeTest0001",
            "StripeEventSourceFor": "stripe",
            "EngineRoomSources": "stripe",
            "EngineRoomSecretArns": "{arn:billing-inbox/stripe}",
        },
        "outputs": {
            "AlarmDestinations": ["e-mail to oncall@example.com", "and the AlertHttpsEndpoint on-call tool"],
            # ConsoleFirewall off: the console and the admin API on the HTTP API, with the app's
            "ConsoleUrl": [".execute-api.us-east-1.amazonaws.com/console/"],
            "AdminApiBaseUrl": [".execute-api.us-east-1.amazonaws.com/v1/admin"],
            # every function's group, the seven of them
            "LogGroups": [
                f"/aws/lambda/{STACK}/{f}"
                for f in ("intake", "worker", "scheduler", "migrate", "dispatcher", "api", "bridge")
            ],
        },
    },
    # (c) the stack creates the database and its network, with RDS Proxy, a NAT, effects to
    # both destinations and the app API
    "create mode with VPC and effects": {
        "params": {
            "DatabaseMode": "create",
            "RdsProxy": "true",
            "CreateNatGateway": "true",
            "VpcCidr": "10.90.0.0/16",
            "DatabaseMinCapacity": "0.5",
            "DatabaseMaxCapacity": "8",
            "Sources": '[{"name":"stripe","kind":"stripe","secret_id":"billing-inbox/stripe",'
            '"api_key_secret_id":"billing-inbox/stripe-api-key"},'
            '{"name":"kinde","kind":"kinde","jwks_url":"https://example.kinde.com/.well-known/jwks"}]',
            "SourceSecretArns": "{arn:billing-inbox/stripe}",
            "SourceApiKeySecretArns": "{arn:billing-inbox/stripe-api-key}",
            "PlansSecretArn": "billing-inbox/plans",
            "EffectsWebhookUrl": "https://app.example/billing-events",
            "EffectsEventBus": "billing",
            "EffectsEventBusCreate": "true",
            "ApiKeysSecretArn": "{arn:billing-inbox/api-keys}",
            "AlertEmail": "none",
        },
        "protected": [],
        "outputs": {"AlarmDestinations": ["NONE: ", "no one is paged"]},
    },
    # (d) production: the stack's own database, protected once it holds data
    "create mode, production": {
        "params": {
            "Sources": KINDE,
            "PlansSecretArn": "billing-inbox/plans",
            "AlertHttpsEndpoint": "https://events.pagerduty.com/integration/0123abcd/enqueue",
            "DatabaseDeletionProtection": "true",
        },
        "protected": ["DatabaseCluster"],
        "outputs": {"AlarmDestinations": ["the AlertHttpsEndpoint on-call tool"]},
    },
    # (e) RDS's own managed secret of a cluster, in the team's VPC, which reaches S3 (and
    # the rest of AWS) through its NAT
    "bring-your-own, RDS's managed secret, through a NAT": {
        "params": {
            "DatabaseMode": "existing",
            "DatabaseSecretArn": "{arn:rds!cluster-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9}",
            "DatabaseHost": "billing.cluster-c0ffee.us-east-1.rds.amazonaws.com",
            "DatabaseName": "billing",
            "VpcEndpoints": "create",
            "VpcId": "{net:vpc}",
            "RouteTableIds": "none",
            "SubnetIds": "{net:subnet-a},{net:subnet-b}",
            "SecurityGroupIds": "{net:sg}",
            "Sources": KINDE,
            "PlansSecretArn": "billing-inbox/plans",
            "AlertEmail": "oncall@example.com",
            "WorkerProviderReads": "false",
        },
        "protected": [],
    },
    # (f) meter reports without effects: the dispatcher is there for the reports alone, and
    # may read the metered source's API key
    "meter reports, no effects": {
        "params": {
            "Sources": '[{"name":"stripe","kind":"stripe","secret_id":"billing-inbox/stripe",'
            '"api_key_secret_id":"billing-inbox/stripe-api-key","meter":{"event_name":"api_calls"}}]',
            "SourceSecretArns": "{arn:billing-inbox/stripe}",
            "SourceApiKeySecretArns": "{arn:billing-inbox/stripe-api-key}",
            "PlansSecretArn": "billing-inbox/plans",
            "MeterReports": "on",
            "ApiKeysSecretArn": "{arn:billing-inbox/api-keys}",
            "AlertEmail": "oncall@example.com",
        },
        "protected": [],
        "outputs": {
            "LogGroups": [
                f"/aws/lambda/{STACK}/{f}"
                for f in ("intake", "worker", "scheduler", "migrate", "dispatcher", "api")
            ],
        },
    },
    # (g) the console and the admin API on a REST API of their own behind AWS WAF: the HTTP
    # API keeps the webhook and the app's routes, the outputs point at the REST API's stage
    "the console behind AWS WAF (ConsoleFirewall on)": {
        "needs": ["ConsoleFirewall"],
        "params": {
            "Sources": KINDE,
            "PlansSecretArn": "billing-inbox/plans",
            "ApiKeysSecretArn": "{arn:billing-inbox/api-keys}",
            "AlertEmail": "oncall@example.com",
            "ConsoleFirewall": "on",
            "ConsoleRateLimit": "600",
            "ConsoleAnonymousRateLimit": "60",
        },
        "protected": [],
        "outputs": {
            "ConsoleUrl": [".execute-api.us-east-1.amazonaws.com/ops/console/"],
            "AdminApiBaseUrl": [".execute-api.us-east-1.amazonaws.com/ops/v1/admin"],
            "ConsoleWebAclArn": ["DROPPED-ConsoleWebAcl.Arn"],
        },
    },
}

# -- what moto cannot create -----------------------------------------------------------------

# Resource types dropped before the stack is created, each with the reason: moto 5.2.5's
# CloudFormation has no model for it (it would skip it, listing a resource with no id or
# type, and leave every Ref to it unresolved), or creates it wrongly. Keep this minimal: a
# type moto can create is created.
#
# Found with one-resource stacks in moto 5.2.5, for the types a template with its own
# network and database would add: created CREATE_COMPLETE with an id and a working Ref are
# EC2::VPC (GetAtt CidrBlock, DefaultSecurityGroup), Subnet (GetAtt AvailabilityZone and
# VpcId do not resolve), RouteTable, SubnetRouteTableAssociation, SecurityGroup (GetAtt
# GroupId; not VpcId), VPCEndpoint of type Interface and Gateway (GetAtt DnsEntries makes
# moto return no outputs at all), InternetGateway, VPCGatewayAttachment, EIP (GetAtt
# AllocationId), NatGateway, Route; a non-Aurora RDS::DBInstance (GetAtt Endpoint.Address;
# not MasterUserSecret.SecretArn). Created without an id (NO_PHYSICAL_ID below):
# EC2::SecurityGroupIngress, RDS::DBSubnetGroup. Fn::GetAZs and Fn::Select work.
DROP = {
    "AWS::ApiGatewayV2::Api": "no moto model (it has REST APIs, AWS::ApiGateway::*, only)",
    "AWS::ApiGatewayV2::Stage": "no moto model (it has REST APIs, AWS::ApiGateway::*, only)",
    "AWS::ApiGateway::Stage": "no moto model (RestApi, Resource, Method and Deployment only)",
    "AWS::ApiGateway::Deployment": "moto creates a RestApi without importing its Body (OpenAPI), "
    "and refuses a deployment of it: 'The REST API doesn't contain any methods'",
    "AWS::WAFv2::WebACL": "no moto model in CloudFormation (moto's wafv2 has no CloudFormation resources)",
    "AWS::WAFv2::WebACLAssociation": "no moto model in CloudFormation (moto's wafv2 has no CloudFormation resources)",
    "AWS::CloudWatch::Alarm": "no moto model (CloudWatch::Dashboard only)",
    "AWS::Logs::MetricFilter": "no moto model (Logs::LogGroup and Logs::ResourcePolicy only)",
    "AWS::SNS::Subscription": "no moto model (SNS::Topic only)",
    "AWS::SecretsManager::Secret": "no moto model",
    "AWS::Lambda::EventInvokeConfig": "no moto model (SAM writes one for EventInvokeConfig)",
    "AWS::SQS::QueuePolicy": "no moto model (SQS::Queue only)",
    # (a rule on the default bus is created; see DROP_WHEN)
    "AWS::Events::Rule": "a rule on a partner bus fails in moto: its PutRule takes what follows "
    "the last '/' of the bus name (aws.partner/stripe.com/...) for the name, and finds no such bus",
    "AWS::Lambda::Alias": "no moto model",
    "AWS::Lambda::Version": "moto lists it with an empty id, its Ref is the logical id, and a "
    "GetAtt Version makes moto return no outputs at all",
    "AWS::EC2::SecurityGroupEgress": "no moto model",
    "AWS::RDS::DBCluster": "no moto model",
    "AWS::RDS::DBClusterParameterGroup": "no moto model",
    "AWS::RDS::DBProxy": "no moto model",
    "AWS::RDS::DBProxyTargetGroup": "no moto model",
    # (a postgres or mysql DBInstance is created; see DROP_WHEN)
    "AWS::RDS::DBInstance": "an Aurora instance fails in moto (KeyError 'aurora-postgresql')",
    "Custom::*": "moto invokes the ServiceToken function, which needs Docker here, and the "
    "stack stays CREATE_IN_PROGRESS",
}

# For a type in DROP that moto creates in some forms: drop only the forms it cannot.
DROP_WHEN = {
    "AWS::RDS::DBInstance": lambda props: str(props.get("Engine", "")).startswith("aurora"),
    "AWS::Events::Rule": lambda props: "EventBusName" in props,
}

# The AWS managed policies SAM may attach (none here: every function names its own role),
# so the transform never asks IAM for the list.
MANAGED_POLICIES = {
    "AWSLambdaBasicExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    "AWSLambdaSQSQueueExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole",
    "AWSLambdaVPCAccessExecutionRole": "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole",
}

# Types moto creates but lists without a physical id (its model has none): listed
# CREATE_COMPLETE is enough for them, and their check finds the object by its properties.
NO_PHYSICAL_ID = {
    "AWS::Lambda::Permission",  # the statement is in the function's policy (checked)
    "AWS::Events::EventBus",  # found by its Name (checked)
    # Its Ref is moto's Python object, which moto's own RDS models expect (a DBInstance
    # reads the object's name), so it stays; in an output, a variable or a policy it is the
    # object's repr and fails the run (UNRESOLVED).
    "AWS::EC2::SecurityGroupIngress",  # the rule is in its group (checked)
    "AWS::RDS::DBSubnetGroup",  # found by its subnets (checked)
}


# Function properties moto's CloudFormation does not pass to Lambda (5.2.5 passes Code,
# Handler, Role, Runtime, Description, MemorySize, Timeout, VpcConfig, Environment,
# ReservedConcurrentExecutions): checked in the template given to moto instead, resolved
# here (they must be literals, parameters or Refs to resources moto created).
LAMBDA_IGNORED = ("Architectures", "Layers", "LoggingConfig")

# Properties with which CloudFormation cannot delete what it created (a rollback or a stack
# delete then fails on it), checked on the transformed template with the set's conditions,
# before anything is dropped (moto has no model of an RDS cluster).
DELETE_BLOCKERS = ("DeletionProtection", "DeletionProtectionEnabled", "DisableApiTermination")

UNRESOLVED = re.compile(r"\{\s*['\"](Ref|Fn::[A-Za-z]+)['\"]|\$\{[^}]*\}|\{\{resolve:|<moto\.|object at 0x")


class Failure(Exception):
    pass


def dropped(type_, props=None):
    if type_.startswith("Custom::") and "Custom::*" in DROP:
        return True
    if type_ not in DROP:
        return False
    return DROP_WHEN[type_](props or {}) if type_ in DROP_WHEN else True


def placeholder(logical_id, attribute=None):
    text = f"DROPPED-{logical_id}" + (f".{attribute}" if attribute else "")
    # An ARN attribute stays ARN-shaped, where IAM (and moto) take only ARNs: a policy's
    # Resource naming a dropped cluster's secret.
    if attribute and attribute.endswith("Arn"):
        return f"arn:aws:dropped:{REGION}:{ACCOUNT}:{text}"
    return text


# -- the template: the rules' module, the transform, what moto cannot evaluate ---------------


def template_rules():
    """scripts/template-rules.py as a module: its YAML loader and its parameter checks."""
    path = Path(__file__).with_name("template-rules.py")
    spec = importlib.util.spec_from_file_location("template_rules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sam_transform(template, params):
    """The SAM transform as sam validate runs it offline, CodeUri as sam package writes it."""
    template = copy.deepcopy(template)
    for resource in template["Resources"].values():
        if resource.get("Type") == "AWS::Serverless::Function":
            props = resource.setdefault("Properties", {})
            if props.get("CodeUri", ".") == "." or not str(props.get("CodeUri")).startswith("s3://"):
                props["CodeUri"] = f"s3://{CODE_BUCKET}/{CODE_KEY}"
    translator = Translator(
        managed_policy_map=None,
        sam_parser=Parser(),
        plugins=[],
        boto_session=boto3.Session(region_name=REGION),
    )
    return translator.translate(
        sam_template=template,
        parameter_values=dict(params),
        get_managed_policy_map=lambda: MANAGED_POLICIES,
    )


def condition_values(conditions, params):
    """Each condition's value, as CloudFormation evaluates them (a condition may use another)."""
    values = {}

    def value(expr):
        if isinstance(expr, (str, int, float)):
            return str(expr)
        if isinstance(expr, list):
            return [value(e) for e in expr]
        (fn, arg), = expr.items()
        if fn == "Ref":
            return params[arg]
        if fn in ("Condition", "Fn::Condition"):  # the latter: template-rules.py's !Condition
            return cond(arg)
        if fn == "Fn::Equals":
            a, b = (value(x) for x in arg)
            return a == b
        if fn == "Fn::Not":
            return not value(arg[0])
        if fn == "Fn::And":
            return all(value(a) for a in arg)
        if fn == "Fn::Or":
            return any(value(a) for a in arg)
        if fn == "Fn::Join":
            sep, items = arg
            return value(sep).join(value(items))
        if fn == "Fn::Select":
            index, items = arg
            return value(items)[int(value(index))]
        raise Failure(f"condition function {fn} is not known to this script")

    def cond(name):
        if name not in values:
            values[name] = bool(value(conditions[name]))
        return values[name]

    for name in conditions:
        cond(name)
    return values


NOVALUE = object()


def resolve_conditions(node, conditions):
    """Fn::If by the conditions' values, AWS::NoValue removed (from maps and lists alike)."""
    if isinstance(node, dict):
        if set(node) == {"Fn::If"}:
            name, yes, no = node["Fn::If"]
            return resolve_conditions(yes if conditions[name] else no, conditions)
        if node == {"Ref": "AWS::NoValue"}:
            return NOVALUE
        out = {}
        for key, value in node.items():
            value = resolve_conditions(value, conditions)
            if value is not NOVALUE:
                out[key] = value
        return out
    if isinstance(node, list):
        items = [resolve_conditions(v, conditions) for v in node]
        return [v for v in items if v is not NOVALUE]
    return node


def sub_parameters(node, params):
    """Fn::Sub strings holding a dynamic reference, with the parameters substituted, so the
    reference can be resolved before moto (which leaves {{resolve:...}} as it is)."""
    if isinstance(node, dict):
        if set(node) == {"Fn::Sub"} and isinstance(node["Fn::Sub"], str) and "{{resolve:" in node["Fn::Sub"]:
            text = node["Fn::Sub"]
            names = re.findall(r"\$\{([^!}][^}]*)\}", text)
            if all(n in params for n in names):
                for n in names:
                    text = text.replace("${" + n + "}", str(params[n]))
                return text
        return {k: sub_parameters(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [sub_parameters(v, params) for v in node]
    return node


def resolve_cidr(node, params):
    """Fn::Cidr, which moto does not evaluate, computed as CloudFormation documents it: the
    first `count` blocks of `cidrBits` host bits in the block (here a parameter or a
    literal)."""
    if isinstance(node, dict):
        if set(node) == {"Fn::Cidr"}:
            block, count, bits = node["Fn::Cidr"]
            if isinstance(block, dict) and set(block) == {"Ref"} and block["Ref"] in params:
                block = params[block["Ref"]]
            if isinstance(block, str):
                net = ipaddress.ip_network(block)
                prefix = net.max_prefixlen - int(bits)
                return [str(n) for n in itertools.islice(net.subnets(new_prefix=prefix), int(count))]
        return {k: resolve_cidr(v, params) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_cidr(v, params) for v in node]
    return node


def resolve_dynamic_references(node, secret_value):
    if isinstance(node, dict):
        return {k: resolve_dynamic_references(v, secret_value) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_dynamic_references(v, secret_value) for v in node]
    if isinstance(node, str):
        return re.sub(
            r"\{\{resolve:secretsmanager:([^}]*)\}\}", lambda m: secret_value(m.group(1)), node
        )
    return node


def replace_dropped(node, gone):
    """Every Ref, GetAtt and ${} to a dropped resource, as its placeholder string."""
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in gone:
            return placeholder(node["Ref"])
        if set(node) == {"Fn::GetAtt"}:
            target = node["Fn::GetAtt"]
            target = target.split(".", 1) if isinstance(target, str) else target
            if target[0] in gone:
                return placeholder(target[0], target[1])
        if set(node) == {"Fn::Sub"}:
            arg = node["Fn::Sub"]
            text, variables = (arg, {}) if isinstance(arg, str) else arg

            def swap(m):
                name = m.group(1)
                base = name.split(".", 1)[0]
                if base in gone and name not in variables:
                    return placeholder(*name.split(".", 1))
                return m.group(0)

            text = re.sub(r"\$\{([^!}][^}]*)\}", swap, text)
            variables = replace_dropped(variables, gone)
            return {"Fn::Sub": text if not variables else [text, variables]}
        return {k: replace_dropped(v, gone) for k, v in node.items()}
    if isinstance(node, list):
        return [replace_dropped(v, gone) for v in node]
    return node


def prepare(cfn_template, params, secret_value):
    """The transformed template as moto can create it, and what was dropped (id -> type)."""
    template = copy.deepcopy(cfn_template)
    template.pop("Rules", None)  # evaluated by template-rules.py; moto ignores them
    conditions = condition_values(template.pop("Conditions", {}), params)
    resources = {}
    for logical_id, resource in template["Resources"].items():
        if "Condition" in resource:
            if not conditions[resource.pop("Condition")]:
                continue
        resources[logical_id] = resource
    outputs = {}
    for name, output in template.get("Outputs", {}).items():
        if "Condition" in output:
            if not conditions[output.pop("Condition")]:
                continue
        outputs[name] = output
    template["Resources"], template["Outputs"] = resources, outputs
    template = resolve_conditions(template, conditions)
    template = resolve_dynamic_references(sub_parameters(template, params), secret_value)
    template = resolve_cidr(template, params)

    models = get_model_map()
    unknown = sorted(
        {r["Type"] for r in resources.values() if r["Type"] not in models and not dropped(r["Type"], r.get("Properties"))}
    )
    if unknown:
        raise Failure(
            f"moto cannot create {unknown} and DROP does not list them: add each to DROP "
            "with the reason, or check a newer moto"
        )
    gone = {lid: r["Type"] for lid, r in template["Resources"].items() if dropped(r["Type"], r.get("Properties"))}
    for lid in gone:
        del template["Resources"][lid]
    for resource in template["Resources"].values():
        if "DependsOn" in resource:
            deps = resource["DependsOn"]
            deps = [deps] if isinstance(deps, str) else deps
            deps = [d for d in deps if d not in gone]
            if deps:
                resource["DependsOn"] = deps
            else:
                del resource["DependsOn"]
    return replace_dropped(template, gone), gone


def protected_resources(cfn_template, params):
    """The resources of this parameter set that CloudFormation could not delete."""
    conditions = condition_values(cfn_template.get("Conditions", {}), params)
    found = []
    for logical_id, resource in cfn_template["Resources"].items():
        if "Condition" in resource and not conditions[resource["Condition"]]:
            continue
        props = resolve_conditions(resource.get("Properties", {}), conditions)
        for key in DELETE_BLOCKERS:
            if key not in props:
                continue
            value = props[key]
            if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in params:
                value = params[value["Ref"]]
            if not isinstance(value, (str, bool)):
                raise Failure(f"{logical_id}.{key} is {value!r}: this script cannot tell whether it is on")
            if str(value).lower() == "true":
                found.append(logical_id)
    return sorted(found)


# -- one parameter set -----------------------------------------------------------------------


def placeholder_zip():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("bootstrap", "#!/bin/sh\n# placeholder: the stack check never invokes\n")
    return buf.getvalue()


def team_network(ec2):
    """The team's own VPC that a bring-your-own set runs in (it exists before the stack, as
    the secrets do): two private subnets in two zones, their route tables, the functions'
    security group. `{net:NAME}` in a set stands for the id of NAME."""
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    ids = {"vpc": vpc}
    for n, zone in enumerate(("a", "b")):
        ids[f"subnet-{zone}"] = ec2.create_subnet(
            VpcId=vpc, CidrBlock=f"10.20.{n}.0/24", AvailabilityZone=f"{REGION}{zone}"
        )["Subnet"]["SubnetId"]
        ids[f"rtb-{zone}"] = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.associate_route_table(RouteTableId=ids[f"rtb-{zone}"], SubnetId=ids[f"subnet-{zone}"])
    ids["sg"] = ec2.create_security_group(GroupName="functions", Description="the functions", VpcId=vpc)["GroupId"]
    return ids


def run_set(rules, template, label, entry):
    """Create the stack for one parameter set; the summary line, or Failure."""
    specs = template["Parameters"]
    aws = boto3.Session(region_name=REGION)
    s3, sm, cfn = aws.client("s3"), aws.client("secretsmanager"), aws.client("cloudformation")
    s3.create_bucket(Bucket=CODE_BUCKET)
    s3.put_object(Bucket=CODE_BUCKET, Key=CODE_KEY, Body=placeholder_zip())
    arns = {name: sm.create_secret(Name=name, SecretString=value)["ARN"] for name, value in EXISTING_SECRETS.items()}
    ids = team_network(aws.client("ec2"))
    # What Stripe's event destination does before the deploy: the partner event source,
    # in this account (a partner bus can only be made for a source that exists).
    if entry["params"].get("StripeEventSourceName"):
        aws.client("events").create_partner_event_source(
            Name=entry["params"]["StripeEventSourceName"], Account=ACCOUNT
        )

    def fill(value):
        value = re.sub(r"\{arn:([^}]+)\}", lambda m: arns[m.group(1)], value)
        return re.sub(r"\{net:([^}]+)\}", lambda m: ids[m.group(1)], value)

    given = {name: fill(value) for name, value in entry["params"].items()}
    try:
        problems = rules.check(template, given)
    except SystemExit as e:  # template-rules.py's own refusal: unknown or missing parameters
        raise Failure(str(e)) from e
    if problems:
        raise Failure(f"the set is refused by the constraints or Rules: {problems}")
    raw = {n: str(given.get(n, s.get("Default"))) for n, s in specs.items()}
    params = {n: rules.values_of(specs[n], raw[n]) for n in specs}
    params.update({
        "AWS::StackName": STACK,
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
    })

    def secret_value(reference):
        # {{resolve:secretsmanager:ID[:SecretString[:key[:stage[:version]]]]}}; ID is a
        # name or a whole ARN (which holds colons itself)
        if reference.startswith("arn:"):
            parts = reference.split(":")
            secret_id, rest = ":".join(parts[:7]), parts[7:]
        else:
            secret_id, *rest = reference.split(":")
        value = sm.get_secret_value(SecretId=secret_id)["SecretString"]
        if len(rest) >= 2 and rest[1]:
            value = str(json.loads(value)[rest[1]])
        return value

    try:
        sam = sam_transform(template, raw)
    except InvalidDocumentException as e:
        raise Failure(f"the SAM transform failed: {e}; {' '.join(str(c) for c in e.causes)}") from e
    # CloudFormation's resource quota counts the template as the transform expands it
    # ("Understand CloudFormation quotas": 500 resources).
    if len(sam["Resources"]) > rules.TEMPLATE_QUOTAS["resources"]:
        raise Failure(f"{len(sam['Resources'])} resources after the SAM transform, over CloudFormation's 500")
    protected = protected_resources(sam, params)
    if protected != sorted(entry.get("protected", [])):
        raise Failure(
            f"CloudFormation could not delete {protected or 'nothing'} (a deletion protection "
            f"on), the set expects {entry.get('protected', [])}: a failed deploy would stop "
            "in ROLLBACK_FAILED on them"
        )
    ready, gone = prepare(sam, params, secret_value)

    try:
        cfn.create_stack(
            StackName=STACK,
            TemplateBody=json.dumps(ready),
            Parameters=[{"ParameterKey": n, "ParameterValue": v} for n, v in given.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
        )
    except Exception as e:  # moto raises its own errors from inside CreateStack too
        hint = ""
        if isinstance(e, KeyError):
            hint = " (a Ref or ${} to a name that is neither a parameter nor a resource moto created)"
        raise Failure(f"moto's CreateStack refused the template: {type(e).__name__}: {e}{hint}") from e
    try:
        cfn.get_waiter("stack_create_complete").wait(
            StackName=STACK, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
        )
    except Exception:  # the status below says what happened
        pass
    stack = cfn.describe_stacks(StackName=STACK)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        raise Failure(f"stack {stack['StackStatus']}: {stack.get('StackStatusReason', '')}")

    failures = []
    listed = {r.get("LogicalResourceId"): r for r in cfn.describe_stack_resources(StackName=STACK)["StackResources"]}
    physical = {}
    for lid, resource in ready["Resources"].items():
        r = listed.get(lid)
        if r is None:
            failures.append(f"{lid} ({resource['Type']}): not listed by describe_stack_resources")
        elif r.get("ResourceStatus") != "CREATE_COMPLETE" or (
            not r.get("PhysicalResourceId") and resource["Type"] not in NO_PHYSICAL_ID
        ):
            failures.append(f"{lid} ({resource['Type']}): {r.get('ResourceStatus')} physical id {r.get('PhysicalResourceId')!r}")
        else:
            physical[lid] = r.get("PhysicalResourceId")
    extra = sorted(set(listed) - set(ready["Resources"]))
    if extra:
        failures.append(f"listed but not in the template: {extra}")

    seen = Checks(aws, ready, params, physical, failures)
    seen.specs = specs
    for lid, resource in ready["Resources"].items():
        check = CHECKS.get(resource["Type"])
        if check and lid in physical:
            try:
                check(seen, lid, resource["Properties"] if "Properties" in resource else {})
            except Exception as e:  # an API error is a missing or wrong object
                failures.append(f"{lid} ({resource['Type']}): {type(e).__name__}: {e}")

    outputs = {o["OutputKey"]: o.get("OutputValue") for o in stack.get("Outputs", [])}
    dropped_outputs = []
    for name, output in ready["Outputs"].items():
        value = outputs.get(name)
        expected = sorted(set(re.findall(r"DROPPED-([A-Za-z0-9]+)", json.dumps(output["Value"]))))
        if not isinstance(value, str) or not value.strip():
            failures.append(f"output {name}: {value!r}, not a non-empty string")
        elif UNRESOLVED.search(value):
            failures.append(f"output {name}: unresolved: {value}")
        elif expected:
            if not all(placeholder(e) in value for e in expected):
                failures.append(f"output {name}: {value!r} should carry the placeholder of {expected}")
            dropped_outputs.append(f"{name}->{'+'.join(expected)}")
    missing = sorted(set(ready["Outputs"]) - set(outputs))
    if missing and not outputs:
        failures.append(
            "moto returned no outputs at all (it drops them all when one output has a GetAtt "
            f"its model does not support): {missing}"
        )
    elif missing:
        failures.append(f"outputs not in the stack: {missing}")
    for name, parts in entry.get("outputs", {}).items():
        value = outputs.get(name) or ""
        absent = [p for p in parts if p not in value]
        if absent:
            failures.append(f"output {name}: {value!r} does not say {absent}")
    if failures:
        raise Failure("; ".join(failures))

    by_type = {}
    for t in gone.values():
        short = t.split("::", 1)[1] if t.startswith("AWS::") else t
        by_type[short] = by_type.get(short, 0) + 1
    return (
        f"{len(physical)} resources created, {len(gone)} dropped "
        f"({', '.join(f'{n} {t}' for t, n in sorted(by_type.items()))}), "
        f"{len(outputs)} outputs resolved"
        + (f", protected from deletion: {', '.join(protected)}" if protected else ", nothing protected from deletion")
        + (f" ({len(dropped_outputs)} with a placeholder: {', '.join(dropped_outputs)})" if dropped_outputs else "")
        + (f"; placeholders: {placeholder_summary(seen.placeholders)}" if seen.placeholders else "")
    )


def placeholder_summary(places):
    """'Proxy in IntakeFunction, WorkerFunction; ...' from 'IntakeFunction.DATABASE_HOST->Proxy', ..."""
    by_target = {}
    for place in places:
        where, target = place.split("->", 1)
        by_target.setdefault(target.split(".", 1)[0], set()).add(where.split(".", 1)[0])
    return "; ".join(f"{t} in {', '.join(sorted(w))}" for t, w in sorted(by_target.items()))


# -- what each resource must be, asked of the service moto made it in ------------------------


class Checks:
    def __init__(self, aws, template, params, physical, failures):
        self.aws, self.template, self.params = aws, template, params
        self.physical, self.failures = physical, failures
        self.placeholders = []  # where a dropped resource's placeholder stands
        self.clients = {}

    def client(self, service):
        if service not in self.clients:
            self.clients[service] = self.aws.client(service)
        return self.clients[service]

    def fail(self, lid, message):
        self.failures.append(f"{lid}: {message}")

    def expect(self, lid, what, actual, expected):
        if str(actual) != str(expected):
            self.fail(lid, f"{what} is {actual!r}, the template says {expected!r}")

    def value(self, node):
        """What a property is once created, when this script can tell without moto: a
        literal, a parameter, a pseudo-parameter, an Fn::Sub of those; else None."""
        if isinstance(node, (str, int, float, bool)):
            return node
        if isinstance(node, dict) and set(node) == {"Ref"} and node["Ref"] in self.params:
            v = self.params[node["Ref"]]
            return ",".join(v) if isinstance(v, list) else v
        if isinstance(node, dict) and set(node) == {"Fn::Sub"} and isinstance(node["Fn::Sub"], str):
            names = re.findall(r"\$\{([^!}][^}]*)\}", node["Fn::Sub"])
            if all(n in self.params for n in names):
                text = node["Fn::Sub"]
                for n in names:
                    text = text.replace("${" + n + "}", str(self.params[n]))
                return text
        return None

    def ids(self, node):
        """A list of ids as given: a list parameter, or a list of Refs/GetAtts to created
        resources (their physical ids) and literals; None when this script cannot tell."""
        if isinstance(node, dict) and set(node) == {"Ref"} and isinstance(self.params.get(node["Ref"]), list):
            return list(self.params[node["Ref"]])
        if isinstance(node, list):
            items = [self.resolve_id(x) for x in node]
            return None if any(x is None for x in items) else items
        return None

    def resolve_id(self, node):
        """The id a Ref or GetAtt (of an EC2 object's own id) to a created resource stands for."""
        if isinstance(node, dict) and "Fn::GetAtt" in node:
            return self.physical.get(node["Fn::GetAtt"][0])
        return self.resolve(node)

    def resolve(self, node):
        """A property moto ignores, resolved as CloudFormation would: literals, parameters,
        Fn::Sub of parameters, a Ref to a created resource (its physical id); else None."""
        if isinstance(node, list):
            items = [self.resolve(x) for x in node]
            return None if any(x is None for x in items) else items
        if isinstance(node, dict) and set(node) == {"Ref"} and node["Ref"] in self.physical:
            return self.physical[node["Ref"]]
        if isinstance(node, dict) and not (set(node) & {"Ref", "Fn::Sub", "Fn::GetAtt", "Fn::Join"}):
            items = {k: self.resolve(v) for k, v in node.items()}
            return None if any(v is None for v in items.values()) else items
        return self.value(node)


CHECKS = {}


def checks(type_):
    def register(fn):
        CHECKS[type_] = fn
        return fn

    return register


def unresolved_in(value):
    text = value if isinstance(value, str) else json.dumps(value)
    return UNRESOLVED.search(text)


def queue_arn(c, lid):
    url = c.physical[lid]
    return c.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


# SQS's documented ranges for a queue's attributes (CreateQueue, "Attributes",
# docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_CreateQueue.html; the
# message size's upper bound raised from 262,144 to 1,048,576 in 2025). moto creates a queue
# outside them (a VisibilityTimeout of 43,201 s, a ReceiveMessageWaitTimeSeconds of 21 were
# seen), so they are checked here.
SQS_QUEUE_RANGES = {
    "DelaySeconds": (0, 900),
    "MaximumMessageSize": (1024, 1_048_576),
    "MessageRetentionPeriod": (60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": (0, 20),
    "VisibilityTimeout": (0, 43_200),
}


def as_int(value):
    """A resolved property value as an integer; None when unresolved or absent."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def out_of_range(value, low, high):
    """Whether a resolved property value lies outside [low, high] (an unresolved one is not
    this check's to judge)."""
    n = as_int(value)
    return n is not None and not low <= n <= high


@checks("AWS::SQS::Queue")
def check_queue(c, lid, props):
    for key, (low, high) in SQS_QUEUE_RANGES.items():
        if key in props and out_of_range(c.value(props[key]), low, high):
            c.fail(lid, f"{key} {c.value(props[key])} is outside SQS's {low} to {high}")
    attrs = c.client("sqs").get_queue_attributes(QueueUrl=c.physical[lid], AttributeNames=["All"])["Attributes"]
    for key in ("VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds", "ReceiveMessageWaitTimeSeconds"):
        if key in props:
            c.expect(lid, key, attrs.get(key), c.value(props[key]))
    if "SqsManagedSseEnabled" in props:
        c.expect(lid, "SqsManagedSseEnabled", attrs.get("SqsManagedSseEnabled", "").lower(), str(props["SqsManagedSseEnabled"]).lower())
    if "RedrivePolicy" in props:
        policy = json.loads(attrs.get("RedrivePolicy", "{}"))
        target = props["RedrivePolicy"]["deadLetterTargetArn"]
        dlq = target["Fn::GetAtt"][0] if isinstance(target, dict) and "Fn::GetAtt" in target else None
        if dlq is None or dlq not in c.physical:
            c.fail(lid, f"redrive target {target!r} is not a queue of this stack")
        else:
            c.expect(lid, "RedrivePolicy.deadLetterTargetArn", policy.get("deadLetterTargetArn"), queue_arn(c, dlq))
        c.expect(lid, "RedrivePolicy.maxReceiveCount", policy.get("maxReceiveCount"), props["RedrivePolicy"]["maxReceiveCount"])


# Lambda's documented limits a first deploy can meet (Lambda quotas, "Function configuration,
# deployment, and execution", docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html;
# CreateFunction API reference for timeout and memory): the deploy fails at the function,
# after what came before it was created.
LAMBDA_ENV_BYTES = 4096  # "Environment variables: 4 KB, for all environment variables associated with the function, combined"
LAMBDA_TIMEOUT_MAX = 900  # "Function timeout: 900 seconds (15 minutes)"
LAMBDA_MEMORY = (128, 10240)  # "Function memory allocation: 128 MB to 10,240 MB"
LAMBDA_LAYERS_MAX = 5  # "Lambda layers: five layers"
# "Defined runtime environment variables" the runtime sets and a function may not (Lambda's
# "Working with Lambda environment variables", reserved keys).
LAMBDA_RESERVED_ENV = {
    "_HANDLER", "_X_AMZN_TRACE_ID", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_EXECUTION_ENV",
    "AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "AWS_LAMBDA_FUNCTION_VERSION",
    "AWS_LAMBDA_INITIALIZATION_TYPE", "AWS_LAMBDA_LOG_GROUP_NAME", "AWS_LAMBDA_LOG_STREAM_NAME",
    "AWS_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_LAMBDA_RUNTIME_API", "LAMBDA_TASK_ROOT", "LAMBDA_RUNTIME_DIR",
}
# CloudFormation's "Parameter value" quota: a parameter without MaxLength can be this long.
PARAMETER_VALUE_BYTES = 4096


def parameters_in(node, specs):
    """The template parameters an expression reads (Ref and ${} in Fn::Sub)."""
    found = set()
    if isinstance(node, dict):
        for key, arg in node.items():
            if key == "Ref" and arg in specs:
                found.add(arg)
            elif key == "Fn::Sub":
                text = arg if isinstance(arg, str) else arg[0]
                found |= {n for n in re.findall(r"\$\{([^!}.][^}.]*)\}", text) if n in specs}
                if not isinstance(arg, str):
                    found |= parameters_in(arg[1], specs)
            else:
                found |= parameters_in(arg, specs)
    elif isinstance(node, list):
        for item in node:
            found |= parameters_in(item, specs)
    return found


def parameter_cap(spec):
    """The longest value CloudFormation accepts for a parameter: its longest allowed value, a
    Number's widest within its bounds, its MaxLength, else the Parameter value quota."""
    if "AllowedValues" in spec:
        return max(len(str(v)) for v in spec["AllowedValues"])
    if spec["Type"] == "Number" and "MaxValue" in spec:
        return max(len(str(spec["MaxValue"])), len(str(spec.get("MinValue", 0))))
    return int(spec.get("MaxLength", PARAMETER_VALUE_BYTES))


def env_bytes(variables):
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in variables.items())


def env_budget_errors(c, lid, want_env, got_env):
    """The environment as created, and at its longest: every parameter it reads at its
    MaxLength (or CloudFormation's 4,096 bytes), so that a value CloudFormation accepts can
    never make a function Lambda refuses."""
    problems = []
    size = env_bytes(got_env)
    if size > LAMBDA_ENV_BYTES:
        problems.append(f"environment of {size} bytes, over Lambda's {LAMBDA_ENV_BYTES}")
    worst = size
    specs = getattr(c, "specs", {})
    grows = []
    for name in sorted(parameters_in(want_env, specs)):
        value = c.params.get(name)
        given = len((",".join(value) if isinstance(value, list) else str(value or "")).encode())
        cap = parameter_cap(specs[name])
        if cap > given:
            worst += cap - given
            grows.append(f"{name} {given}->{cap}")
    if worst > LAMBDA_ENV_BYTES:
        problems.append(
            f"environment of up to {worst} bytes with every parameter it reads at its MaxLength "
            f"({', '.join(grows)}), over Lambda's {LAMBDA_ENV_BYTES}: lower those MaxLength"
        )
    reserved = sorted(set(got_env) & LAMBDA_RESERVED_ENV)
    if reserved:
        problems.append(f"sets {reserved}, which the Lambda runtime reserves")
    return problems


@checks("AWS::Lambda::Function")
def check_function(c, lid, props):
    lam = c.client("lambda")
    conf = lam.get_function(FunctionName=c.physical[lid])["Configuration"]
    for key in ("Runtime", "Handler", "Timeout", "MemorySize", "Description"):
        if key in props:
            want = c.value(props[key])
            if want is not None:
                c.expect(lid, key, conf.get(key), want)
            if unresolved_in(conf.get(key, "")):
                c.fail(lid, f"{key} unresolved: {conf.get(key)!r}")
    for key in LAMBDA_IGNORED:
        if key in props:
            resolved = c.resolve(props[key])
            if resolved is None or unresolved_in(resolved) or "DROPPED-" in json.dumps(resolved):
                c.fail(lid, f"{key} {props[key]!r} does not resolve to created resources and parameters")
    role = props.get("Role")
    if isinstance(role, dict) and "Fn::GetAtt" in role:
        role_name = c.physical.get(role["Fn::GetAtt"][0])
        arn = c.client("iam").get_role(RoleName=role_name)["Role"]["Arn"]
        c.expect(lid, "Role", conf.get("Role"), arn)
    for layer in c.resolve(props.get("Layers", [])) or []:
        if not re.fullmatch(r"arn:aws:lambda:[a-z0-9-]+:[0-9]{12}:layer:[A-Za-z0-9_-]+:[0-9]+", str(layer)):
            c.fail(lid, f"layer {layer!r} is not a layer version ARN")
    vpc = props.get("VpcConfig")
    got_vpc = conf.get("VpcConfig") or {}
    if vpc:
        for key, prefix in (("SubnetIds", "subnet-"), ("SecurityGroupIds", "sg-")):
            got = sorted(got_vpc.get(key, []))
            want = c.ids(vpc.get(key))
            if want is not None:
                c.expect(lid, f"VpcConfig.{key}", got, sorted(want))
            if not got or not all(str(x).startswith(prefix) for x in got):
                c.fail(lid, f"VpcConfig.{key} is {got!r}")
    elif got_vpc.get("SubnetIds"):
        c.fail(lid, f"in a VPC the template does not give: {got_vpc}")
    reserved = lam.get_function_concurrency(FunctionName=c.physical[lid]).get("ReservedConcurrentExecutions")
    if "ReservedConcurrentExecutions" in props:
        c.expect(lid, "ReservedConcurrentExecutions", reserved, c.value(props["ReservedConcurrentExecutions"]))
    elif reserved is not None:
        c.fail(lid, f"reserved concurrency {reserved} the template does not give")
    group = props.get("LoggingConfig", {}).get("LogGroup")
    if isinstance(group, dict) and "Ref" in group:
        target = c.template["Resources"].get(group["Ref"], {}).get("Type")
        if target != "AWS::Logs::LogGroup":
            c.fail(lid, f"LoggingConfig.LogGroup names {group['Ref']} ({target}), not a log group of the stack")
    want_env = props.get("Environment", {}).get("Variables", {})
    got_env = conf.get("Environment", {}).get("Variables", {})
    for problem in env_budget_errors(c, lid, want_env, got_env):
        c.fail(lid, problem)
    timeout, memory = conf.get("Timeout", 3), conf.get("MemorySize", 128)
    if not 1 <= timeout <= LAMBDA_TIMEOUT_MAX:
        c.fail(lid, f"timeout {timeout} s, Lambda takes 1 to {LAMBDA_TIMEOUT_MAX}")
    if not LAMBDA_MEMORY[0] <= memory <= LAMBDA_MEMORY[1]:
        c.fail(lid, f"memory {memory} MB, Lambda takes {LAMBDA_MEMORY[0]} to {LAMBDA_MEMORY[1]}")
    if len(c.resolve(props.get("Layers", [])) or []) > LAMBDA_LAYERS_MAX:
        c.fail(lid, f"more than {LAMBDA_LAYERS_MAX} layers")
    if sorted(got_env) != sorted(want_env):
        c.fail(lid, f"variables {sorted(got_env)}, the template gives {sorted(want_env)}")
    for name, node in want_env.items():
        got = got_env.get(name)
        if got is None:
            continue
        if not str(got).strip() or unresolved_in(got):
            c.fail(lid, f"variable {name} unresolved or empty: {got!r}")
            continue
        for target in sorted(set(re.findall(r"DROPPED-([A-Za-z0-9]+)", str(got)))):
            c.placeholders.append(f"{lid}.{name}->{target}")
        want = c.value(node)
        if want is not None:
            c.expect(lid, f"variable {name}", got, want)


def policy_resources(document):
    statements = document.get("Statement", [])
    for st in statements if isinstance(statements, list) else [statements]:
        resources = st.get("Resource", [])
        actions = st.get("Action", [])
        yield (resources if isinstance(resources, list) else [resources]), (actions if isinstance(actions, list) else [actions])


@checks("AWS::IAM::Role")
def check_role(c, lid, props):
    iam = c.client("iam")
    name = c.physical[lid]
    iam.get_role(RoleName=name)
    got = sorted(iam.list_role_policies(RoleName=name)["PolicyNames"])
    want = sorted(p["PolicyName"] for p in props.get("Policies", []))
    c.expect(lid, "inline policies", got, want)
    for policy_name in got:
        document = iam.get_role_policy(RoleName=name, PolicyName=policy_name)["PolicyDocument"]
        if isinstance(document, str):
            # moto's CloudFormation stores the document as the repr of a Python dict
            try:
                document = json.loads(document)
            except ValueError:
                document = ast.literal_eval(document)
        for resources, actions in policy_resources(document):
            for resource in resources:
                ok = (
                    isinstance(resource, str)
                    and (resource.startswith("arn:") or "DROPPED-" in resource
                         or (resource == "*" and all(a.startswith("ec2:") for a in actions)))
                    and not unresolved_in(resource)
                )
                if not ok:
                    c.fail(lid, f"policy {policy_name}: Resource {resource!r} is not an ARN")
                elif "DROPPED-" in resource:
                    c.placeholders.append(f"{lid}.{policy_name}->{resource.split('DROPPED-', 1)[1]}")


@checks("AWS::Logs::LogGroup")
def check_log_group(c, lid, props):
    name = c.physical[lid]
    groups = c.client("logs").describe_log_groups(logGroupNamePrefix=name)["logGroups"]
    group = next((g for g in groups if g["logGroupName"] == name), None)
    if group is None:
        c.fail(lid, f"log group {name} does not exist")
        return
    if "LogGroupName" in props:
        c.expect(lid, "LogGroupName", name, c.value(props["LogGroupName"]))
    if "RetentionInDays" in props:
        c.expect(lid, "RetentionInDays", group.get("retentionInDays"), c.value(props["RetentionInDays"]))


@checks("AWS::SNS::Topic")
def check_topic(c, lid, props):
    attrs = c.client("sns").get_topic_attributes(TopicArn=c.physical[lid])["Attributes"]
    if "DisplayName" in props:
        c.expect(lid, "DisplayName", attrs.get("DisplayName"), props["DisplayName"])


@checks("AWS::Events::EventBus")
def check_bus(c, lid, props):
    bus = c.client("events").describe_event_bus(Name=c.value(props["Name"]))
    c.expect(lid, "Name", bus["Name"], c.value(props["Name"]))


@checks("AWS::Events::Rule")
def check_rule(c, lid, props):
    events = c.client("events")
    rule = events.describe_rule(Name=c.physical[lid])
    if "ScheduleExpression" in props:
        c.expect(lid, "ScheduleExpression", rule.get("ScheduleExpression"), c.value(props["ScheduleExpression"]))
    if "State" in props:
        c.expect(lid, "State", rule.get("State"), props["State"])
    targets = events.list_targets_by_rule(Rule=c.physical[lid])["Targets"]
    c.expect(lid, "targets", sorted(t["Id"] for t in targets), sorted(t["Id"] for t in props.get("Targets", [])))
    for t in targets:
        if not t["Arn"].startswith("arn:") or unresolved_in(t["Arn"]):
            c.fail(lid, f"target {t['Id']} is {t['Arn']!r}")


@checks("AWS::Lambda::EventSourceMapping")
def check_mapping(c, lid, props):
    m = c.client("lambda").get_event_source_mapping(UUID=c.physical[lid])
    source = props["EventSourceArn"]
    if isinstance(source, dict) and "Fn::GetAtt" in source and source["Fn::GetAtt"][0] in c.physical:
        c.expect(lid, "EventSourceArn", m.get("EventSourceArn"), queue_arn(c, source["Fn::GetAtt"][0]))
    function = props["FunctionName"]
    if isinstance(function, dict) and "Ref" in function:
        c.expect(lid, "FunctionArn", m.get("FunctionArn", "").rsplit(":", 1)[-1], c.physical[function["Ref"]])
    for key in ("BatchSize", "MaximumBatchingWindowInSeconds"):
        if key in props:
            c.expect(lid, key, m.get(key), props[key])
    # An SQS mapping's documented ranges (CreateEventSourceMapping,
    # docs.aws.amazon.com/lambda/latest/api/API_CreateEventSourceMapping.html): a batch of 1 to
    # 10,000 for a standard queue, over 10 only with a batching window of at least 1 s; a window
    # of 0 to 300 s; a maximum concurrency of 2 to 1,000.
    batch, window = c.value(props.get("BatchSize", 10)), c.value(props.get("MaximumBatchingWindowInSeconds", 0))
    if out_of_range(batch, 1, 10_000):
        c.fail(lid, f"BatchSize {batch} is outside SQS's 1 to 10,000")
    if out_of_range(window, 0, 300):
        c.fail(lid, f"MaximumBatchingWindowInSeconds {window} is outside 0 to 300")
    if (as_int(batch) or 0) > 10 and out_of_range(window, 1, 300):
        c.fail(lid, f"BatchSize {batch} over 10 needs a batching window of at least 1 s")
    scaling = props.get("ScalingConfig") or {}
    concurrency = c.value(scaling["MaximumConcurrency"]) if "MaximumConcurrency" in scaling else None
    if out_of_range(concurrency, 2, 1000):
        c.fail(lid, f"ScalingConfig.MaximumConcurrency {concurrency} is outside 2 to 1,000")
    if "FunctionResponseTypes" in props:
        c.expect(lid, "FunctionResponseTypes", m.get("FunctionResponseTypes"), props["FunctionResponseTypes"])
    if "ScalingConfig" in props:
        c.expect(lid, "ScalingConfig.MaximumConcurrency", (m.get("ScalingConfig") or {}).get("MaximumConcurrency"),
                 c.value(props["ScalingConfig"]["MaximumConcurrency"]))
    # Lambda refuses a mapping whose queue hides a message for less than the function may run
    # (CreateEventSourceMapping: "Queue visibility timeout ... is less than Function timeout"),
    # and advises six times the timeout ("Using Lambda with Amazon SQS", Configuring a queue),
    # which docs/design.md makes the rule.
    if isinstance(source, dict) and "Fn::GetAtt" in source and isinstance(function, dict) and "Ref" in function:
        queue = c.template["Resources"].get(source["Fn::GetAtt"][0], {}).get("Properties", {})
        fn = c.template["Resources"].get(function["Ref"], {}).get("Properties", {})
        visibility, timeout = c.value(queue.get("VisibilityTimeout", 30)), c.value(fn.get("Timeout", 3))
        if visibility is not None and timeout is not None and int(visibility) < 6 * int(timeout):
            c.fail(lid, f"queue visibility {visibility} s under six times the function's timeout {timeout} s")


# EC2 objects that must exist under their physical id: the describe call and its list key.
EC2_DESCRIBE = {
    "AWS::EC2::VPC": ("describe_vpcs", "VpcIds", "Vpcs"),
    "AWS::EC2::Subnet": ("describe_subnets", "SubnetIds", "Subnets"),
    "AWS::EC2::SecurityGroup": ("describe_security_groups", "GroupIds", "SecurityGroups"),
    "AWS::EC2::RouteTable": ("describe_route_tables", "RouteTableIds", "RouteTables"),
    "AWS::EC2::VPCEndpoint": ("describe_vpc_endpoints", "VpcEndpointIds", "VpcEndpoints"),
    "AWS::EC2::InternetGateway": ("describe_internet_gateways", "InternetGatewayIds", "InternetGateways"),
    "AWS::EC2::NatGateway": ("describe_nat_gateways", "NatGatewayIds", "NatGateways"),
}


def check_ec2(type_):
    method, ids_key, list_key = EC2_DESCRIBE[type_]

    def check(c, lid, props):
        found = getattr(c.client("ec2"), method)(**{ids_key: [c.physical[lid]]})[list_key]
        if len(found) != 1:
            c.fail(lid, f"{method} finds {len(found)} for {c.physical[lid]}")
        elif "VpcId" in props and "VpcId" in found[0]:
            c.expect(lid, "VpcId", found[0]["VpcId"], c.resolve(props["VpcId"]))

    return check


for _type in EC2_DESCRIBE:
    CHECKS[_type] = check_ec2(_type)


@checks("AWS::EC2::SecurityGroupIngress")
def check_ingress(c, lid, props):
    group = c.resolve_id(props.get("GroupId"))
    (sg,) = c.client("ec2").describe_security_groups(GroupIds=[group])["SecurityGroups"]
    ports = [(p.get("IpProtocol"), p.get("FromPort"), p.get("ToPort")) for p in sg.get("IpPermissions", [])]
    want = (str(props["IpProtocol"]), int(props.get("FromPort", -1)), int(props.get("ToPort", -1)))
    if want not in [(str(a), b, c_) for a, b, c_ in ports]:
        c.fail(lid, f"no rule {want} in {group}: {ports}")


@checks("AWS::RDS::DBSubnetGroup")
def check_db_subnet_group(c, lid, props):
    subnets = sorted(c.resolve_id(x) for x in props["SubnetIds"])
    groups = c.client("rds").describe_db_subnet_groups()["DBSubnetGroups"]
    if not any(sorted(s["SubnetIdentifier"] for s in g["Subnets"]) == subnets for g in groups):
        c.fail(lid, f"no DB subnet group over {subnets}")


@checks("AWS::Lambda::Permission")
def check_permission(c, lid, props):
    function = props["FunctionName"]
    name = c.physical[function["Ref"]] if isinstance(function, dict) and "Ref" in function else c.value(function)
    policy = json.loads(c.client("lambda").get_policy(FunctionName=name)["Policy"])
    principals = [json.dumps(s.get("Principal")) for s in policy.get("Statement", [])]
    if not any(props["Principal"] in p for p in principals):
        c.fail(lid, f"no statement for {props['Principal']} in the function's policy")
    if unresolved_in(json.dumps(policy)):
        c.fail(lid, f"policy unresolved: {policy}")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    warnings.simplefilter("ignore")  # moto's and the translator's deprecation notes
    # the translator's note on its metrics, never published here; moto's notes on types it
    # skips (prepare() refuses those unless DROP lists them)
    logging.getLogger("samtranslator").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.ERROR)
    rules = template_rules()
    template = rules.load(path)
    failures = 0
    ran = 0
    for label, entry in SETS.items():
        lacking = [p for p in entry.get("needs", []) if p not in template["Parameters"]]
        if lacking:
            print(f"skip  {label}: the template has no {', '.join(lacking)} parameter yet")
            continue
        started = time.monotonic()
        try:
            with mock_aws():
                summary = run_set(rules, template, label, entry)
            print(f"ok    {label}: {summary} [{time.monotonic() - started:.1f}s]")
            ran += 1
        except Failure as e:
            print(f"FAIL  {label}: {e}")
            failures += 1
    if failures:
        print(f"template-stack: {failures} parameter set(s) failed")
        sys.exit(1)
    print(f"template-stack: ok ({ran} sets created in moto; DROP lists {len(DROP)} types moto cannot create)")


if __name__ == "__main__":
    main()
