"""examples/ray_checkpoint.py: two Ray actors each load half of a checkpoint with hetmem.load and
hand their tensors to the other through Ray's NIXL tensor transport, every byte checked. Runs
where ray, torch and NIXL's ``nixl`` package are installed (CI's Python suite has none of them:
skipped there, visibly); ``HETMEM_REQUIRE_RAY=1`` makes a missing one fail instead."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ray_checkpoint.py"
MISSING = [name for name in ("ray", "torch", "nixl", "safetensors") if importlib.util.find_spec(name) is None]

if MISSING and os.environ.get("HETMEM_REQUIRE_RAY") != "1":
    pytest.skip(f"the Ray example needs {', '.join(MISSING)}", allow_module_level=True)


def test_two_actors_hand_their_halves_of_a_checkpoint_over_by_nixl(rng):
    assert not MISSING, f"HETMEM_REQUIRE_RAY=1 but {MISSING} are missing"
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp,sm,self")  # NIXL refuses shared memory alone
    seed = int(rng.integers(0, 2**31))
    done = subprocess.run([sys.executable, str(EXAMPLE), "--make-mib", "16", "--seed", str(seed), "--json"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["seed"] == seed
    received = sorted(name for part in result["received"] for name in part["received"])
    assert len(received) == 8 and all(not part["wrong"] for part in result["received"])
    # Each actor got the other's half: names of the other parity.
    for part in result["received"]:
        indices = {int(name.split(".")[1]) % 2 for name in part["received"]}
        assert indices == {1 - part["rank"]}, part
