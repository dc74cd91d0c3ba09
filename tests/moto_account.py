"""The simulated AWS account the tests share (the ``moto`` fixture of tests/conftest.py)."""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}
"""Credentials moto accepts; set so that no test can reach a real account through a profile."""


class MotoAccount:
    """One test's moto account in one region: clients and the resources the stack's tests need.

    Every method creates what it names the way template.yaml's resource is configured where that
    matters (the state table by ``create_table``, buckets outside us-east-1 with their location).
    """

    def __init__(self, region: str) -> None:
        self.region = region

    @functools.cache  # noqa: B019 - one account per test: the cache dies with it
    def client(self, service: str) -> Any:
        """The account's boto3 client for ``service`` (one per service)."""
        import boto3

        return boto3.client(service, region_name=self.region)

    def bucket(self, name: str, *, versioned: bool = False) -> Any:
        """Create the S3 bucket ``name`` (versioned if asked); return the S3 client."""
        s3 = self.client("s3")
        if self.region == "us-east-1":  # the one region S3 refuses a LocationConstraint for
            s3.create_bucket(Bucket=name)
        else:
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": self.region})
        if versioned:
            s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return s3

    def seed_objects(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Put ``objects`` (key -> bytes) into ``bucket`` through moto's S3 backend, as its PutObject
        stores them (a new version in a versioned bucket), without one API round trip each.

        For a test's Given only, when it needs many objects (a listing past one page): each PutObject
        through boto3 and moto's request parsing costs ~10 ms of CPU, and what the test proves is how
        the product reads them back, which still goes through the API."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for key, data in objects.items():
            backend.put_object(bucket, key, data)

    def state_table(self, name: str) -> Any:
        """Create the state table ``name`` as the stack defines it; return the DynamoDB client."""
        from alphaagent.aws.store import create_table

        dynamodb = self.client("dynamodb")
        create_table(dynamodb, name)
        return dynamodb

    def queue(self, name: str, **attributes: str) -> str:
        """Create the SQS queue ``name``; return its URL."""
        url: str = self.client("sqs").create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        return url

    def queue_arn(self, url: str) -> str:
        """The ARN of the queue at ``url``."""
        attributes = self.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        arn: str = attributes["Attributes"]["QueueArn"]
        return arn


# -- the SDK's data files, read once per process ---------------------------------------------------


def share_sdk_data() -> None:
    """Make every botocore session of the process read the SDK's data files through one cache, and
    check and alias its event handlers once per process (tests/sdk_data.py). Idempotent.
    tests/conftest.py calls it when botocore is first imported."""
    import botocore.session
    from sdk_data import create_loader, share_handler_checks

    botocore.session.create_loader = create_loader
    share_handler_checks()


_VALID_DEFINITIONS: set[str] = set()


def remember_valid_state_machines(monkeypatch: Any) -> None:
    """moto's ``CreateStateMachine`` parses the definition with its ANTLR grammar (~0.2 s of CPU for
    turn.asl.yaml) only to refuse an invalid one; the parse is deterministic, so a definition that
    passed once in this process passes again without it. A new or changed definition is parsed
    (and refused) as before, and every execution still parses and runs the definition itself."""
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend

    validate = StepFunctionsParserBackend._validate_definition

    def validate_once(definition: str) -> None:
        if definition not in _VALID_DEFINITIONS:
            validate(definition=definition)  # raises InvalidDefinition for a bad definition
            _VALID_DEFINITIONS.add(definition)

    monkeypatch.setattr(StepFunctionsParserBackend, "_validate_definition", staticmethod(validate_once))


_PROGRAMS: dict[str, Any] = {}
_PROGRAMS_LOCK = threading.Lock()


def _fix_heap_keys(node: Any, seen: set[int]) -> None:
    """Give every component of a parsed program its ``heap_key`` now, before any execution runs it.

    ``EvalComponent.heap_key`` is the one value moto sets on a component while evaluating: a uid made
    on first use, under which the component keeps its per-execution state (a retrier's attempt
    count, a backoff's next multiplier) in that execution's own ``env.heap``. Made lazily, two
    executions running the shared program at once could each make one, and the first would then
    look its attempt count up under the second's key."""
    from moto.stepfunctions.parser.asl.component.component import Component
    from moto.stepfunctions.parser.asl.component.eval_component import EvalComponent

    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, EvalComponent):
        _ = node.heap_key
    if isinstance(node, Component):
        children: Any = vars(node).values()
    elif isinstance(node, dict):
        children = node.values()
    elif isinstance(node, list | tuple | set | frozenset):
        children = node
    else:
        return
    for child in children:
        _fix_heap_keys(child, seen)


def reuse_parsed_state_machines(monkeypatch: Any) -> None:
    """Parse a state machine's definition once per process, not once per execution.

    moto's Step Functions starts every execution by parsing the definition with its ANTLR grammar
    (``ExecutionWorker._get_evaluation_entrypoint``; ~0.2 s of CPU for turn.asl.yaml, a tenth of a
    turn's CPU in the turn-machine tests). The parsed program is safe to share, as moto's own code
    shows (moto 5.2.5, ``stepfunctions/parser/asl/component``): a component's attributes are set
    when it is built (``__init__``, ``from_state_props``); while evaluating, components read them and
    keep everything that changes in the execution's ``Environment`` (its stack, heap, context and
    event history), which each execution makes anew; the one attribute set later is ``heap_key``,
    fixed here before the program is shared (``_fix_heap_keys``). The per-run objects of a Map
    state (``MapRunRecord``, job pools) are made per execution too; turn.asl.yaml has none. The
    same text parses to the same program, and a changed definition is parsed on its own."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

    def entrypoint(self: Any) -> Any:
        definition: str = self._evaluation_details.state_machine_details.definition
        with _PROGRAMS_LOCK:
            program = _PROGRAMS.get(definition)
            if program is None:
                program = AmazonStateLanguageParser.parse(definition)[0]
                _fix_heap_keys(program, set())
                _PROGRAMS[definition] = program
        return program

    monkeypatch.setattr(ExecutionWorker, "_get_evaluation_entrypoint", entrypoint)


def reuse_state_machine_clients(monkeypatch: Any) -> None:
    """Give moto's Step Functions interpreter one boto3 client per region and service while the
    patch holds, instead of a new one for every Task state it runs.

    ``boto_client_for`` (moto 5.2.5, ``stepfunctions/parser/asl/utils/boto_client.py``) makes a
    client with fixed arguments (the access key ``ak``, no retries) on every call: ~25 ms of CPU
    each, five or more a turn. A boto3 client is thread-safe, and these carry no per-call state;
    each is made on first use from the default session of the moment, so it takes the handlers the
    IAM harness installed on it (hold the patch no longer than one moto session: a module's stack)."""
    import sys

    import moto.stepfunctions.parser.asl.parse.asl_parser  # noqa: F401 - imports every state's module
    from moto.stepfunctions.parser.asl.utils import boto_client

    made = boto_client.boto_client_for
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with lock:
            if (region, service) not in clients:
                clients[(region, service)] = made(region, service, state_credentials)
            return clients[(region, service)]

    prefix = "moto.stepfunctions.parser."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and getattr(module, "boto_client_for", None) is made:
            monkeypatch.setattr(module, "boto_client_for", client_for)


def share_parsed_json_paths(monkeypatch: Any) -> None:
    """Parse each JSONPath moto evaluates once while the patch holds, not on every use.

    ``jsonpath_ng.ext.parse`` (jsonpath-ng 1.16.0) builds a new ply parser, LR tables and all, on
    every call (~15 ms of CPU); moto's EventBridge calls it for every input path of every target an
    event goes to (``EventTemplateParser.parse``), and its Step Functions for every path a state
    reads. A parsed path is shared safely: the expression classes (``jsonpath_ng/jsonpath.py`` and
    ``ext/``) set no attribute after ``__init__``, and ``find`` builds new result objects."""
    import jsonpath_ng
    import jsonpath_ng.ext
    import jsonpath_ng.ext.parser
    import moto.stepfunctions.parser.asl.component.common.path.result_path as result_path
    import moto.stepfunctions.parser.asl.utils.json_path as json_path

    extended = functools.lru_cache(maxsize=1024)(jsonpath_ng.ext.parser.parse)
    plain = functools.lru_cache(maxsize=1024)(jsonpath_ng.parse)
    monkeypatch.setattr(jsonpath_ng.ext, "parse", extended)  # moto.events imports it when called
    monkeypatch.setattr(jsonpath_ng.ext.parser, "parse", extended)
    monkeypatch.setattr(json_path, "parse", extended)  # bound when moto's module was imported
    monkeypatch.setattr(result_path, "parse", plain)


# -- S3's conditional writes, atomic as in S3 --------------------------------------------------------

_CONDITIONAL_WRITE_HEADERS = ("If-None-Match", "If-Match")


def serialise_conditional_writes() -> None:
    """Make moto's conditional S3 writes atomic, as S3's are.

    S3 checks a write's condition (``IfNoneMatch="*"``: no object has the key; ``IfMatch``: its ETag)
    and writes in one step, so of two concurrent conditional PutObjects of one key at most one
    succeeds (the other gets 412 PreconditionFailed or 409 ConditionalRequestConflict; S3 User Guide,
    "How to prevent object overwrites with conditional writes"). moto looks the key up, then stores
    the object, with nothing between: two threads could both find the key missing and both write,
    so the env function's two concurrent deliveries of one run both claimed it and both ran the code
    (seen under load as one delivery's ``FileExistsError`` on the run's scratch folder). One lock
    around moto's handling of a conditional PutObject or CompleteMultipartUpload closes that gap; an
    S3 request calls no other service, so it cannot deadlock. Idempotent."""
    from moto.s3.responses import S3Response

    if getattr(S3Response._key_response_put, "_serialised", False):
        return
    lock = threading.RLock()

    def conditional(method: Any) -> Any:
        @functools.wraps(method)
        def handle(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not any(self.headers.get(name) for name in _CONDITIONAL_WRITE_HEADERS):
                return method(self, *args, **kwargs)
            with lock:
                return method(self, *args, **kwargs)

        handle._serialised = True  # type: ignore[attr-defined]
        return handle

    S3Response._key_response_put = conditional(S3Response._key_response_put)  # type: ignore[method-assign]
    S3Response._key_response_post = conditional(S3Response._key_response_post)  # type: ignore[method-assign]


# -- moto's dispatch of a request to its handler method ----------------------------------------------

_RESPONSE_METHODS: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()


def remember_response_methods() -> None:
    """Make moto's look-up of a request's handler method read each response class's method names
    once per process, not on every request.

    ``BaseResponse.call_action`` (moto 5.2.5, moto/core/responses.py) lists the class's functions
    with ``inspect.getmembers`` for every request, only to test whether the action is among them
    (~5% of a request's CPU, ~0.2 ms). The names are remembered per class; an action not among them
    is looked up afresh (a method added later is found), so the answer is always moto's own.
    Idempotent."""
    import sys

    from moto.core.utils import method_names_from_class

    responses = sys.modules["moto.core.responses"]  # run as it is imported: moto.core is not yet bound
    if getattr(responses.method_names_from_class, "_remembered", False):
        return

    class Names(frozenset[str]):
        """The remembered names of one class: a miss is checked against the class as it is now."""

        clazz: type

        def __contains__(self, name: object) -> bool:
            return frozenset.__contains__(self, name) or name in method_names_from_class(self.clazz)

    def remembered(clazz: Any) -> Any:
        names = _RESPONSE_METHODS.get(clazz)
        if names is None:
            names = Names(method_names_from_class(clazz))
            names.clazz = clazz
            _RESPONSE_METHODS[clazz] = names
        return names

    remembered._remembered = True  # type: ignore[attr-defined]
    responses.method_names_from_class = remembered
