"""The HTTP gateway's OpenAPI 3.1 description, served at GET /openapi.json: what HTTP callers generate clients from.

The schemas describe exactly the bodies `gateway.answer`, `Reply.error` and the health routes write (the tests
validate real replies against them), so a change to one is a change to the other.
"""

from __future__ import annotations

from typing import Any

OPENAPI_PATH = "/openapi.json"

_NUMBER_MS = {"type": "number", "minimum": 0}

_ANSWER = {
    "type": "object",
    "required": ["utterance_id", "transcript", "intent", "slots", "confidence", "model_id", "timings_ms",
                 "batch_size"],
    "additionalProperties": False,
    "properties": {
        "utterance_id": {"type": "string", "description": "the utterance_id query parameter, or empty"},
        "transcript": {"type": "string", "description": "the words, lower case, as the corpora write them"},
        "intent": {"type": "string", "description": "scenario_action, SLURP style (e.g. alarm_set)"},
        "slots": {"type": "array", "items": {
            "type": "object", "required": ["type", "value"], "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "value": {"type": "string"}}}},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1,
                       "description": "the served model's confidence in its answer"},
        "model_id": {"type": "string", "description": "which cloud model answered"},
        "timings_ms": {
            "type": "object", "required": ["queue", "inference", "server", "gateway"], "additionalProperties": False,
            "properties": {"queue": _NUMBER_MS, "inference": _NUMBER_MS, "server": _NUMBER_MS,
                           "gateway": {**_NUMBER_MS, "description": "the whole request as the gateway timed it"}}},
        "batch_size": {"type": "integer", "minimum": 1,
                       "description": "requests the server decoded together with this one"},
    },
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["status", "message"], "additionalProperties": False,
        "properties": {
            "status": {"type": "string", "description": "a stable reason, e.g. invalid_audio, unauthenticated, "
                                                        "resource_exhausted, deadline, unavailable"},
            "message": {"type": "string", "description": "what went wrong, for people"}}}},
}

_READY = {
    "type": "object", "required": ["status", "cloud"], "additionalProperties": False,
    "properties": {"status": {"type": "string", "enum": ["serving", "not serving"]},
                   "cloud": {"type": "string", "description": "the gRPC target(s) the gateway forwards to"}},
}

_HEALTH = {"type": "object", "required": ["status"], "additionalProperties": False,
           "properties": {"status": {"type": "string", "const": "ok"}}}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _errors(*codes_and_reasons: tuple[str, str]) -> dict[str, Any]:
    return {code: _json("Error", reason) for code, reason in codes_and_reasons}


def openapi_document(understand_path: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a gateway serving `understand_path`."""
    understand = {
        "post": {
            "operationId": "understand",
            "summary": "Transcript, intent and slots of a spoken command",
            "description": "POST the audio file's bytes (WAV, FLAC, OGG, ...: any rate, mono or stereo); the gateway "
                           "resamples it and asks the cloud model.",
            "parameters": [{"name": "utterance_id", "in": "query", "required": False, "schema": {"type": "string"},
                            "description": "echoed in the answer and the server's logs"}],
            "requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "contentMediaType": "audio/*"}}}},
            "security": [{}, {"bearer": []}],
            "responses": {
                "200": _json("Answer", "the cloud's answer"),
                **_errors(("400", "not audio libsndfile reads, empty, or too short or long"),
                          ("401", "a missing, malformed or refused bearer token"),
                          ("411", "no Content-Length"), ("413", "a body over the gateway's limit"),
                          ("429", "the server's queue or the gateway's bound on requests is full; Retry-After"),
                          ("502", "the cloud failed"), ("503", "the cloud is unreachable"),
                          ("504", "the cloud did not answer within the deadline")),
            },
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "PASU cloud gateway", "version": version,
                 "description": "HTTP/JSON in front of PASU's gRPC cloud server (`pasu cloud gateway`)."},
        "paths": {
            understand_path: understand,
            "/healthz": {"get": {"operationId": "health", "summary": "The gateway runs",
                                 "responses": {"200": _json("Health", "always, while the gateway runs")}}},
            "/readyz": {"get": {"operationId": "ready", "summary": "The cloud answers its gRPC health check",
                                "responses": {"200": _json("Ready", "the cloud serves"),
                                              "503": _json("Ready", "the cloud does not serve")}}},
            OPENAPI_PATH: {"get": {"operationId": "openapi", "summary": "This document",
                                   "responses": {"200": {"description": "OpenAPI 3.1",
                                                         "content": {"application/json": {}}}}}},
        },
        "components": {
            "schemas": {"Answer": _ANSWER, "Error": _ERROR, "Ready": _READY, "Health": _HEALTH},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "forwarded to the cloud server, which checks it"}},
        },
    }
