"""The order in which ``make test`` hands the test modules to its workers
(tests/conftest.py): the longest first, so that none waits at the end for another."""

from __future__ import annotations

from tests.conftest import _WORKER_GROUPS, _rank


def test_the_heavy_group_then_the_server_modules_then_the_in_process_ones() -> None:
    scopes = {
        "tests/unit/test_ids.py": 40,
        "tests/unit/gateway/test_app.py": 174,
        "tests/integration/test_s3_server.py": 1,
        "tests/integration/test_sqs_clients.py": 58,
        "tests/k8s/test_manifests.py": 30,
        "heavy": 60,
        "tests/fault/test_crash.py": 5,
    }
    order = sorted(scopes, key=lambda scope: _rank(scope, scopes[scope]))
    assert order == [
        "heavy",
        "tests/integration/test_sqs_clients.py",
        "tests/fault/test_crash.py",
        "tests/integration/test_s3_server.py",
        "tests/unit/gateway/test_app.py",
        "tests/unit/test_ids.py",
        "tests/k8s/test_manifests.py",
    ]
    assert set(_WORKER_GROUPS.values()) == {"heavy"}
