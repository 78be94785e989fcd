"""The state file's text (emulator/runtime/state.py `write`): its links are encoded a chunk at a
time, and the file must be what json.dumps gives for the whole document, byte for byte, so
that every reader (and every older reader) sees the same document."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cmemu.emulator.model.topology import build
from cmemu.emulator.runtime import state


@pytest.mark.parametrize("chunk", [1, 100, 1024, 100_000])
def test_the_file_is_the_whole_document_byte_for_byte(
    chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "LINKS_CHUNK", chunk)
    topology = build("cm-mini")  # 528 links: one chunk, several, or one each
    path = tmp_path / "state.json"
    state.write(path, topology, mode="inprocess", launcher={"argv": ["up"]})
    text = path.read_text()
    doc = json.loads(text)
    whole = topology.to_dict() | {"launcher": doc["launcher"]}
    assert text == json.dumps(whole)
    assert state.read(path) == topology
    assert doc["launcher"]["argv"] == ["up"]


def test_a_topology_without_links_still_writes_an_empty_list(tmp_path: Path) -> None:
    """The edge the chunks must not get wrong: no chunk at all."""
    topology = dataclasses.replace(build("cm-mini"), links=())
    path = tmp_path / "state.json"
    state.write(path, topology, mode="inprocess")
    assert json.loads(path.read_text())["links"] == []
    assert path.read_text() == json.dumps(
        topology.to_dict() | {"launcher": json.loads(path.read_text())["launcher"]}
    )


def test_a_different_document_is_told_apart(tmp_path: Path) -> None:
    """The comparison above can fail: one link less is another text."""
    topology = build("cm-mini")
    path = tmp_path / "state.json"
    state.write(path, dataclasses.replace(topology, links=topology.links[:-1]), mode="inprocess")
    launcher = json.loads(path.read_text())["launcher"]
    assert path.read_text() != json.dumps(topology.to_dict() | {"launcher": launcher})
