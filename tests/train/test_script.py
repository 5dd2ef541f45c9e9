"""The training scripts' shared logger writes timestamped lines to the file and to stderr."""

from specgen.train.script import file_logger


def test_file_logger(tmp_path, capsys):
    log = file_logger(tmp_path / "run.log")
    log("step 1 loss 2.0")
    log("done")
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["step 1 loss 2.0", "done"]
    assert "done" in capsys.readouterr().err
