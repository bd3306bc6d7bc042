"""Helpers shared by the command-line tests."""

from rpwjax import cli


def run(argv, capsys):
    """``rpwjax ARGV`` in process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err
