"""``hetmem.doctor()`` and ``python -m hetmem doctor``: what ``hetmem doctor`` reports (the
backend, the driver, each GPU and pair, the host, and every check with its remedy), gathered
by the same code in the native half."""

from __future__ import annotations

import json
from typing import Any, Dict, List

from . import _native, device

#: The schema of the report, as ``hetmem doctor --json`` names it.
SCHEMA = "hetmem.doctor/1"


def doctor() -> Dict[str, Any]:
    """The doctor's report on this machine, as ``hetmem doctor --json`` prints it: ``schema``,
    ``hetmem_version``, ``backend``, ``driver``, ``devices``, ``pairs``, ``host`` and ``checks``
    (each with ``scope``, ``name``, ``status`` ``"ok"``/``"warn"``/``"fail"``, ``detail`` and,
    for a warn or fail, a ``remedy``).

    Example::

        import hetmem
        report = hetmem.doctor()
        for check in report["checks"]:
            if check["status"] != "ok":
                print(check["name"], check["detail"], "->", check["remedy"])
    """
    report = json.loads(_native.doctor_json(device()))
    return {"schema": SCHEMA, **report}


def checks_text(report: Dict[str, Any]) -> str:
    """The report's backend and checks, a line each (``hetmem doctor`` prints the full text)."""
    backend = report["backend"]
    lines: List[str] = [f"hetmem {report['hetmem_version']} doctor",
                        f"backend: {backend['selected']}" + (f" (fallback: {backend['fallback_reason']})"
                                                            if backend.get("fallback_reason") else "")]
    for check in report["checks"]:
        line = f"{check['status']:4}  {check['scope']:10} {check['name']}: {check['detail']}"
        if check.get("remedy"):
            line += f"\n      remedy: {check['remedy']}"
        lines.append(line)
    return "\n".join(lines) + "\n"
