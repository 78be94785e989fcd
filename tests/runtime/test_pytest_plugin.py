"""The cmemu pytest plugin's options and emulator lifetimes (issue 20, item 8), through pytester
in a subprocess as a user's project runs it: the port range and the default preset come from the
command line or the ini file (the command line wins), bad values are usage errors that say where
they came from, and `fresh="test"` / `fresh="module"` give a test or a module an emulator of its
own, stopped after it, while tests that ask for nothing share one. The refusals (usage errors, an
unknown lifetime) start no emulator and run in this process: the plugin keeps what it configures
in the run's own config (its stash), so nothing leaks into this worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmemu.emulator.testing import port_range

pytest_plugins = ("pytester",)

# two tests sharing the session's one emulator: the range each expects is disjoint from the
# other's, so in every run one passes and its twin fails, and which one says whose range won
PORTS_TEST = """
import os

def within(supernode, variable):
    low, high = (int(x) for x in os.environ[variable].split("-"))
    ports = [int(s.address.rsplit(":", 1)[1]) for s in supernode.topology.services]
    assert ports and all(low <= p < high for p in ports), (ports, low, high)
    assert supernode.preset == "cm-mini"

def test_in_the_ini_range(supernode):
    within(supernode, "INI_PORTS")

def test_in_the_command_line_range(supernode):
    within(supernode, "CLI_PORTS")
"""


def _outcome(result: pytest.RunResult) -> dict[str, int]:
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "failed", "errors")}


@pytest.mark.slow
def test_the_port_range_from_the_command_line_wins_over_the_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two ranges inside this xdist worker's own slice of ports: a fixed range would overlap
    # another worker's, whose emulators may bind in it between this one's probe and its bind
    low, high = port_range()
    width = min(1000, (high - low) // 2)
    ini, cli = f"{low}-{low + width}", f"{low + width}-{low + 2 * width}"
    pytester.makeini(f"[pytest]\ncmemu_ports = {ini}\ncmemu_preset = cm-mini\n")
    pytester.makepyfile(test_ports=PORTS_TEST)
    monkeypatch.setenv("INI_PORTS", ini)
    monkeypatch.setenv("CLI_PORTS", cli)
    # one emulator per run (two runs, not one per expectation: each boot is most of a run)
    from_ini = pytester.runpytest_subprocess("-p", "no:randomly", "-v")
    assert _outcome(from_ini) == {"passed": 1, "failed": 1}, from_ini.stdout.str()
    from_ini.stdout.fnmatch_lines(
        ["*::test_in_the_ini_range PASSED*", "*::test_in_the_command_line_range FAILED*"]
    )
    # the twin: the command line's range given, the ini's is no longer satisfied
    from_cli = pytester.runpytest_subprocess("-p", "no:randomly", "-v", "--cmemu-ports", cli)
    assert _outcome(from_cli) == {"passed": 1, "failed": 1}, from_cli.stdout.str()
    from_cli.stdout.fnmatch_lines(
        ["*::test_in_the_ini_range FAILED*", "*::test_in_the_command_line_range PASSED*"]
    )


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (["--cmemu-ports", "32000-22000"], "", "--cmemu-ports: '32000-22000': need 1024 <= FROM"),
        (["--cmemu-ports", "22000"], "", "--cmemu-ports: expected FROM-TO"),
        (["--cmemu-ports", "80-9000"], "", "need 1024 <= FROM < TO <= 65536"),
        ([], "cmemu_ports = lots", "ini cmemu_ports: expected FROM-TO (e.g. 22000-32000)"),
        (["--cmemu-preset", "cm9"], "", "--cmemu-preset: no preset 'cm9'; known: cm-mini"),
        ([], "cmemu_preset = cm9", "ini cmemu_preset: no preset 'cm9'"),
    ],
)
def test_bad_options_are_usage_errors_saying_where_they_came_from(
    pytester: pytest.Pytester, args: list[str], ini: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    # in this process: a usage error boots nothing, and a second interpreter importing pytest's
    # plugins and the emulator is most of what a subprocess run would cost
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str(), result.stderr.str()


def test_an_unknown_lifetime_is_an_error_naming_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fresh="""
import pytest

@pytest.mark.supernode(fresh="sometimes")
def test_it(supernode):
    pass
"""
    )
    result = pytester.runpytest_inprocess()  # refused before any emulator starts
    assert _outcome(result) == {"errors": 1}
    result.stdout.fnmatch_lines(
        ["*test_fresh.py::test_it: supernode(fresh='sometimes'): one of session, module, test*"]
    )


LIFETIMES = """
import json
import os
from pathlib import Path

import pytest

LOG = Path(os.environ["PLUGIN_LOG"])


def record(name, supernode):
    seen = json.loads(LOG.read_text()) if LOG.exists() else {}
    seen[name] = {"state": str(supernode.state_file), "pid": supernode.process.pid}
    LOG.write_text(json.dumps(seen))
    return seen


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
"""

MODULE_A = """
from lifetimes import alive, record
import pytest

def test_shared_1(supernode):
    record("shared_1", supernode)

def test_shared_2(supernode):
    seen = record("shared_2", supernode)
    assert seen["shared_1"] == seen["shared_2"]  # asked for nothing: the session's one

@pytest.mark.supernode(fresh="module")
def test_module_1(supernode):
    seen = record("module_1", supernode)
    assert seen["module_1"]["state"] != seen["shared_1"]["state"]

@pytest.mark.supernode(fresh="module")
def test_module_2(supernode):
    seen = record("module_2", supernode)
    assert seen["module_2"] == seen["module_1"]  # the module's own, shared within it

@pytest.mark.supernode(fresh="test")
def test_own_1(supernode):
    seen = record("own_1", supernode)
    assert seen["own_1"]["state"] not in {seen["module_1"]["state"], seen["shared_1"]["state"]}

@pytest.mark.supernode(fresh="test")
def test_own_2(supernode):
    seen = record("own_2", supernode)
    assert seen["own_2"] != seen["own_1"]
    assert not alive(seen["own_1"]["pid"])  # stopped after its test
    assert alive(seen["module_1"]["pid"])  # the module is not over yet
"""

MODULE_B = """
from lifetimes import alive, record
import pytest

@pytest.mark.supernode(fresh="module")
def test_other_module(supernode):
    seen = record("other", supernode)
    assert seen["other"] != seen["module_1"]
    assert not alive(seen["module_1"]["pid"])  # stopped when its module ended
    assert alive(seen["shared_1"]["pid"])  # the session's lives on
"""


@pytest.mark.slow
def test_a_test_or_a_module_gets_an_emulator_of_its_own_when_it_asks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "seen.json"
    monkeypatch.setenv("PLUGIN_LOG", str(log))
    pytester.makepyfile(lifetimes=LIFETIMES, test_a=MODULE_A, test_b=MODULE_B)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:xdist", "-v")
    assert _outcome(result) == {"passed": 7}, result.stdout.str()
    seen = json.loads(log.read_text())
    assert len({v["pid"] for v in seen.values()}) == 5  # shared, module a, own x2, module b
    # the twin: the same assertions fail when the lifetimes are not what they say (module a's
    # own tests, the ones twisted: module b would boot one more emulator to pass as before)
    log.unlink()
    pytester.makepyfile(test_a=MODULE_A.replace('fresh="test"', 'fresh="module"'))
    twisted = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:xdist", "test_a.py")
    assert _outcome(twisted)["failed"] >= 2, twisted.stdout.str()
