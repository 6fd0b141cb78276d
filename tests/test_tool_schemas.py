"""The tools the agent offers the model: names, descriptions and JSON schemas.

These are an interface, not decoration: the model reads the descriptions to decide which tool to
call and how, and a renamed parameter silently breaks every call the model makes the old way. So
the exact text is pinned in tests/data/tool_schemas.json (reviewed by hand; update it on purpose,
with the change), and each schema is checked against what its tool's code accepts. The modules'
``TOOLS`` lists are read at call time (not through ``all_tools()``, built at import), so that a
changed list is what the test sees.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from ds4agent.tools import all_tools
from ds4agent.tools.base import ToolError, check_arguments

DATA = Path(__file__).parent / "data" / "tool_schemas.json"
MODULES = ("files", "search", "shell", "outline")


def _tools(module: str) -> list:
    return importlib.import_module(f"ds4agent.tools.{module}").TOOLS


def _offered(module: str) -> list[dict]:
    # What the model sees (Tool.schema()'s function part) and the approval kind each call needs.
    return [t.schema()["function"] | {"kind": t.kind} for t in _tools(module)]


@pytest.mark.parametrize("module", MODULES)
def test_offered_tools_are_the_reviewed_ones(module: str) -> None:
    pinned = json.loads(DATA.read_text(encoding="utf-8"))
    assert set(pinned) == set(MODULES)
    assert _offered(module) == pinned[module]


def test_all_tools_offers_every_module_tool_once_under_its_own_name() -> None:
    tools = all_tools()
    every = [t for m in MODULES for t in _tools(m)]
    assert len(tools) == len(every) == 8
    assert all(tools[t.name] is t for t in every)
    for t in every:
        assert t.schema() == {"type": "function", "function": {"name": t.name, "description": t.description,
                                                                "parameters": t.parameters}}


def _sample(spec: dict) -> object:
    # A valid value of each schema type (an enum's first member, an integer at its minimum).
    if "enum" in spec:
        return spec["enum"][0]
    return {"string": "x", "integer": spec.get("minimum", 0), "boolean": True}[spec["type"]]


@pytest.mark.parametrize("name", sorted(all_tools()))
def test_each_schema_is_what_the_argument_check_enforces(name: str) -> None:
    tool = all_tools()[name]
    params = tool.parameters
    assert params["type"] == "object"
    props, required = params["properties"], params.get("required", [])
    assert set(required) <= set(props)
    # Every parameter, at a valid value, is accepted and comes back as given.
    full = {k: _sample(v) for k, v in props.items()}
    assert check_arguments(tool, full) == full
    # Each required one is required; an unknown one is refused with the names the tool takes.
    for k in required:
        with pytest.raises(ToolError, match=f"missing required parameter '{k}' for {name}"):
            check_arguments(tool, {x: v for x, v in full.items() if x != k})
    with pytest.raises(ToolError, match=f"unknown parameter 'nope' for {name}; it takes: {', '.join(props)}"):
        check_arguments(tool, {**full, "nope": 1})
    for k, spec in props.items():
        if "minimum" in spec:
            with pytest.raises(ToolError, match=f"parameter '{k}' must be at least {spec['minimum']}"):
                check_arguments(tool, {**full, k: spec["minimum"] - 1})


def test_stated_defaults_are_the_code_defaults() -> None:
    # A description that names a default must name the one the code uses.
    from ds4agent.tools import files, shell

    def desc(module, tool: str, param: str) -> str:
        return next(t for t in module.TOOLS if t.name == tool).parameters["properties"][param]["description"]

    assert re.search(r"default (\d+)", desc(files, "read", "lines")).group(1) == str(files.DEFAULT_LINES)
    assert re.search(r"default (\d+)", desc(shell, "bash", "timeout")).group(1) == str(shell.DEFAULT_TIMEOUT)
    bash = next(t for t in shell.TOOLS if t.name == "bash")
    assert bash.parameters["properties"]["timeout"]["maximum"] == shell.MAX_TIMEOUT


def test_every_tool_that_edits_shows_its_change_before_approval(tmp_path: Path) -> None:
    # An edit-kind tool without a preview would ask for approval of a change the user cannot see.
    from ds4agent.tools import Workspace, files

    ws = Workspace(tmp_path)
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    by_name = {t.name: t for m in MODULES for t in _tools(m)}
    assert sorted(n for n, t in by_name.items() if t.kind == "edit") == ["edit", "write"]
    assert by_name["write"].preview(ws, {"path": "n.txt", "content": "hi\n"}) == "new file n.txt: 1 line, 3 bytes\nhi"
    assert by_name["edit"].preview(ws, {"path": "a.txt", "old": "two", "new": "2"}) == (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n")
    assert by_name["write"].run is files.write and by_name["edit"].run is files.edit
