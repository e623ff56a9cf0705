"""tests/dist/parity_cases.py's ``job_cases``: a graph case of test_comm_graph.py is taken from a training
case's first step (``from_case``) only when that case builds the same train network with the same inputs;
any other training case is refused before the job starts."""
import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "dist" / "parity_cases.py"


@pytest.fixture
def parity_cases():
    """A fresh copy of the module (tests/dist is on ``sys.path`` only where its tests are collected)."""
    spec = importlib.util.spec_from_file_location("parity_cases_copy", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_keep_graph_case_is_the_first_step_of_its_training_case(parity_cases):
    cases = parity_cases.job_cases(2)
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)) and "s3_keep" not in names
    takers = [(c["name"], c["graph_name"]) for c in cases if "graph_name" in c]
    assert takers == [("s3_graph_a1_keep", "s3_keep")]
    # every graph case of test_comm_graph.py is still made: built, or dumped from its training case
    made = {c["name"] for c in cases if c.get("kind") == "graph"} | {graph for _, graph in takers}
    assert made == {c["name"] for c in parity_cases.GRAPH_CASES[2]}
    assert [c for c in parity_cases.job_cases(4) if "graph_name" in c] == []


@pytest.mark.parametrize("change", [
    {"clip": True}, {"accum": 2}, {"mode": "pynative"}, {"reshard": True}, {"optimizer": "momentum"},
    {"net": "noscalar"}, {"pad": False}, {"fusion": {}}, {"units": ["TinyNet"]}, {"count_calls": True},
])
def test_a_training_case_with_another_network_is_refused(parity_cases, change):
    cases = [dict(c, **change) if c["name"] == "s3_graph_a1_keep" else c for c in parity_cases.CASES[2]]
    parity_cases.CASES[2] = cases
    with pytest.raises(ValueError, match="'s3_keep' takes 'from_case' 's3_graph_a1_keep'"):
        parity_cases.job_cases(2)


def test_a_missing_training_case_is_refused(parity_cases):
    parity_cases.CASES[2] = [c for c in parity_cases.CASES[2] if c["name"] != "s3_graph_a1_keep"]
    with pytest.raises(ValueError, match="which is no training case of the N=2 job"):
        parity_cases.job_cases(2)
