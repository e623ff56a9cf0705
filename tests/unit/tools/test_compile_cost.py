"""tools/bench/compile_cost.py without msrun: its argument errors."""
import pytest

from tools.bench import compile_cost


@pytest.mark.parametrize("argv, named", [(["--world_size", "-1"], "--world_size"), (["--layers", "0"], "--layers"),
                                         (["--repeats", "0"], "--repeats")])
def test_compile_cost_rejects_bad_arguments_before_any_work(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        compile_cost.main(argv + ["--out", str(tmp_path / "out")])
    assert err.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
