"""`kvpreflight --help` and `verify` in a fresh Python process never import torch or an engine
library: poisoned stand-ins ahead of anything installed fail the import and leave a mark."""

from __future__ import annotations

import subprocess
import sys

from record_support import APP_DIGEST, make_keys, write_signed

SUBJECT = f"app=sha256:{APP_DIGEST}"


def test_verify_never_imports_torch_or_an_engine(tmp_path):
    key, _, public = make_keys(tmp_path / "keys")
    record = tmp_path / "record.dsse.json"
    write_signed(record, key)
    # Poisoned stand-ins ahead of anything installed: importing one leaves a mark and fails.
    poison = tmp_path / "poison"
    for name in ("torch", "vllm", "sglang", "transformers", "llama_cpp", "ray"):
        (poison / name).mkdir(parents=True)
        (poison / name / "__init__.py").write_text(
            f"open({str(tmp_path / 'imported')!r}, 'a').write({name!r} + '\\n')\nraise ImportError('poisoned')\n")
    code = (
        "import sys\n"
        "from kvpreflight._internal.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch','vllm','sglang','transformers','llama_cpp','ray'})\n"
        "print('EXIT', code, 'HEAVY', heavy)\n"
    )
    for argv in (["verify", "--help"], ["--help"], ["watch", "--help"],
                 ["verify", str(record), "--key", str(public), "--subject", SUBJECT]):
        result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                                env={"PYTHONPATH": str(poison), "PATH": "/usr/bin:/bin"})
        assert "EXIT 0 HEAVY []" in result.stdout, (argv, result.stdout, result.stderr)
    assert not (tmp_path / "imported").exists()
