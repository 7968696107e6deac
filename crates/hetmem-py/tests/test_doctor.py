"""hetmem.doctor() and `python -m hetmem doctor`: the report `hetmem doctor --json` gives, from
the same native code: the backend in use, and every check with a remedy where it is not ok."""

import json
import subprocess
import sys

import hetmem


def test_the_report_names_the_backend_in_use_and_a_remedy_for_every_problem():
    report = hetmem.doctor()
    assert report["schema"] == "hetmem.doctor/1"
    assert report["backend"]["selected"] == hetmem.device().backend
    assert report["backend"]["fallback_reason"] == hetmem.device().fallback_reason
    assert report["checks"], "the doctor always checks the host"
    for check in report["checks"]:
        assert check["status"] in ("ok", "warn", "fail"), check
        assert (check["remedy"] is not None) == (check["status"] != "ok"), check
    if hetmem.device().backend == "cuda":
        assert report["devices"] and report["driver"]["library_found"]


def test_the_command_prints_the_same_checks_and_fails_strictly_on_a_failure():
    run = subprocess.run([sys.executable, "-m", "hetmem", "doctor", "--json"], capture_output=True, text=True,
                         check=True)
    printed = json.loads(run.stdout)
    # hetmem.doctor() from a fresh interpreter, as the command is: in this one, what earlier
    # tests imported (torch loads its own NVRTC) can change what the checks find.
    fresh = subprocess.run([sys.executable, "-c", "import hetmem, json; print(json.dumps(hetmem.doctor()))"],
                           capture_output=True, text=True, check=True)
    expected = json.loads(fresh.stdout)
    assert expected["schema"] == printed["schema"] == "hetmem.doctor/1"
    assert [(c["scope"], c["name"], c["status"]) for c in printed["checks"]] == \
        [(c["scope"], c["name"], c["status"]) for c in expected["checks"]]
    text = subprocess.run([sys.executable, "-m", "hetmem", "doctor"], capture_output=True, text=True, check=True)
    for check in expected["checks"]:
        assert f"{check['name']}: {check['detail']}" in text.stdout
    strict = subprocess.run([sys.executable, "-m", "hetmem", "doctor", "--strict"], capture_output=True)
    failed = any(check["status"] == "fail" for check in expected["checks"])
    assert strict.returncode == (1 if failed else 0)
