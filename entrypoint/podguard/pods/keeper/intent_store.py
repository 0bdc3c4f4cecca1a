"""Where the user's word lives: a RunPod template per name, the one place every actor can read.

    store = IntentStore(api, "llm-train")       # template `podguard-intent-llm-train`
    store.read()                                 # Intent | None (no record yet); ApiError when the API fails
    store.write(spoken(store.read(), Word.DOWN, by=..., at=...))

Why a template: the keepers of a name may run on this machine under any HOME or user, on another machine, and as a
`--deploy`ed keeper pod on RunPod, which cannot read a laptop's file. RunPod's API is what they all share, and REST
v2 templates are per account, readable and writable with the same key (`GET/POST /v2/templates`,
`GET/PATCH/DELETE /v2/templates/{id}`, runpod/docs `api-reference-v2/openapi.json`), with an `env` map to hold a
value: the record is one template, `podguard-intent-<name>` (category CPU, never used to make a pod), whose env holds
the intent as JSON (`PODGUARD_INTENT`) and the full name (`PODGUARD_INTENT_OF`). It holds no secret. Two records of
one name (two writers that created it in the same moment) are read as one (the newest generation wins), and the
extra one is removed by the next write. A record is read with one request (its id is remembered).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import replace
from typing import Any

from podguard.errors import UsageError
from podguard.pods.api import PodApi
from podguard.pods.errors import ApiError, ApiErrorKind
from podguard.pods.keeper.intent import Intent
from podguard.pods.rest_api import RestApi, answer_field
from podguard.pods.retry import with_retry
from podguard.pods.transport import path_of

__all__ = ["ENV_INTENT", "ENV_INTENT_OF", "RECORD_PREFIX", "IntentStore", "record_name", "rest_of"]

RECORD_PREFIX = "podguard-intent-"
ENV_INTENT = "PODGUARD_INTENT"
ENV_INTENT_OF = "PODGUARD_INTENT_OF"
RECORD_IMAGE = "podguard/intent-record"  # a template needs an image; this one is never pulled
MAX_ADOPTED = 50


def record_name(name: str) -> str:
    """The template's name: `podguard-intent-<name>` (a long name is shortened, with a hash of the whole)."""
    if len(name) <= 80:
        return RECORD_PREFIX + name
    return f"{RECORD_PREFIX}{name[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def rest_of(api: PodApi) -> RestApi:
    """The REST v2 client behind `api` (the GraphQL client carries one as `.rest`)."""
    rest = api if isinstance(api, RestApi) else getattr(api, "rest", None)
    if not isinstance(rest, RestApi):
        raise UsageError("the keep's record is kept through REST v2; this API client has none")
    return rest


class IntentStore:
    def __init__(self, api: PodApi, name: str) -> None:
        self.rest = rest_of(api)
        self.name = name
        self._ids: list[str] | None = None  # the record's template id(s), once found

    # -- reading -------------------------------------------------------------------------------------------
    def read(self) -> Intent | None:
        """The newest intent of the name (None: no record). One request once the record's id is known."""
        if self._ids:
            try:
                found = [self._get(tid) for tid in self._ids]
                return _newest([t for t in found if t is not None])
            except ApiError as exc:
                if exc.kind is not ApiErrorKind.NOT_FOUND:
                    raise
        return _newest(self._find())

    def _get(self, template_id: str) -> dict[str, Any] | None:
        body = self.rest.call("read the keep's record", "GET", path_of("v2", "templates", template_id))
        return body if isinstance(body, dict) and self._ours(body) else None

    def _find(self) -> list[dict[str, Any]]:
        body = self.rest.call("list templates (the keep's record)", "GET", "/v2/templates")
        mine = [t for t in answer_field(body, "templates", "list templates") if isinstance(t, dict) and self._ours(t)]
        mine.sort(key=lambda t: str(t.get("id")))
        self._ids = [str(t["id"]) for t in mine if t.get("id")]
        return mine

    def _ours(self, template: dict[str, Any]) -> bool:
        env = template.get("env") if isinstance(template.get("env"), dict) else {}
        return template.get("name") == record_name(self.name) and env.get(ENV_INTENT_OF, self.name) == self.name

    def _made(self, _error: ApiError) -> dict[str, Any] | None:
        return {"found": True} if self._find() else None

    # -- writing -------------------------------------------------------------------------------------------
    def write(self, intent: Intent) -> None:
        """Write `intent` as the record (create it when there is none); a second record of the name is removed."""
        intent = _capped(intent)
        env = {ENV_INTENT: json.dumps(intent.to_json(), sort_keys=True), ENV_INTENT_OF: self.name}
        found = self._find()
        if not found:
            body = {
                "name": record_name(self.name),
                "image": RECORD_IMAGE,
                "env": env,
                "category": "CPU",
                "startSsh": False,
                "startJupyter": False,
                "ports": [],
                "disk": 1,
            }
            try:
                made = with_retry(
                    lambda: self.rest.transport.request("POST", "/v2/templates", body=body),
                    self.rest.policy,
                    what="create the keep's record",
                    before_retry=self._made,  # a create whose answer was lost may have made it
                )
            except ApiError as exc:
                if exc.kind not in (ApiErrorKind.REJECTED, ApiErrorKind.INVALID, ApiErrorKind.NO_CAPACITY):
                    raise
                made = {"found": True}  # another writer made it in the same moment (names are unique): write into it
            if not made.get("found"):
                self._ids = [str(answer_field(made, "id", "create the keep's record"))]
                return
            found = self._find()
        keep, *extra = [str(t["id"]) for t in found]
        self.rest.call("write the keep's record", "PATCH", path_of("v2", "templates", keep), body={"env": env})
        for tid in extra:  # two writers created it at once: one record is enough
            with contextlib.suppress(ApiError):
                self.rest.call("remove a second record", "DELETE", path_of("v2", "templates", tid))
        self._ids = [keep]


def _newest(templates: list[dict[str, Any]]) -> Intent | None:
    read = []
    for template in templates:
        env = template.get("env") if isinstance(template.get("env"), dict) else {}
        try:
            intent = Intent.from_json(json.loads(env.get(ENV_INTENT, "")))
        except ValueError:
            intent = None
        if intent is not None:
            read.append(intent)
    return max(read, key=lambda i: i.gen) if read else None


def _capped(intent: Intent) -> Intent:
    if len(intent.adopted) <= MAX_ADOPTED:
        return intent
    return replace(intent, adopted=intent.adopted[-MAX_ADOPTED:])
