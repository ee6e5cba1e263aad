"""A warm start between two real studies on this machine: `transformers serve` on CPU, two tiny
models made here. The first study finds a value the engine refuses (a KV block size of 2) and a
block size that serves; the second, on the other model, starts from it: the engine's refusal is
carried as a fact, the first study's best is measured once as a hint to confirm, and every line
says where it came from. Needs torch and transformers[serving] (a failure under CI without them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
import pytest
import yaml

from autotune.search.moves import failed_moves, refused
from autotune.study import warm_start
from tests.helpers.cli import autotune, show
from tests.needs import require_modules

pytestmark = pytest.mark.engine

# The KV cache stays small and fixed: left to the engine it takes most of the host's free RAM.
COMMAND = ("{python} -m transformers.cli.transformers serve {model} --host {host} --port {port} "
           "--continuous-batching --cb-num-blocks 32 --cb-max-batch-tokens 256")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    require_modules(("torch", "transformers", "tokenizers", "fastapi", "uvicorn", "openai"), "transformers serve",
                    "pip install torch 'transformers[serving]'")
    from autotune.testing import make_tiny_llama

    root = tmp_path_factory.mktemp("models")
    return (make_tiny_llama(root / "tiny-a", hidden_size=64, layers=2, vocab=1024),
            make_tiny_llama(root / "tiny-b", hidden_size=32, layers=1, vocab=1024, seed=1))


def _config(tmp: Path, name: str, model: Path, choices: list[int], default: int, **extra: Any) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"name": f"{name}-space", "parameters": {
        "cb_block_size": {"type": "categorical", "choices": choices, "flag": "--cb-block-size", "default": default}}}))
    config = {"name": name, "space": str(space), "objective": "transformers_cpu", "budget": {"trials": 2},
              "storage": f"sqlite:///{tmp}/studies.db", "seed": 0,
              "target": {"engine": "transformers", "model": str(model), "command": COMMAND, "ready_timeout_s": 120,
                         "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}},
              **extra}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_warm_start_between_two_real_studies(models: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = models
    # The first study: its baseline (block size 2) is refused by the engine, its second trial serves.
    autotune("study", "start", str(_config(tmp_path, "model-a", first, [2, 16], 2)), cwd=tmp_path, timeout=300)
    source = show(tmp_path, "model-a")["trials"]
    assert [t["outcome"] for t in source] == ["infeasible", "ok"], source
    assert source[0]["failure"]["kind"] == "invalid-argument" and source[1]["params"] == {"cb_block_size": 16}

    cfg = _config(tmp_path, "model-b", second, [2, 16, 32], 32)
    proc = autotune("study", "start", str(cfg), "--warm-start-from", "model-a", cwd=tmp_path, timeout=300)
    said = proc.stdout + proc.stderr
    assert "warm start from study model-a: same host (" in said and f"another model ({first})" in said, said
    assert "carried as facts: invalid-argument (trials 0)" in said, said
    assert "avoided: cb_block_size=2 (invalid-argument in trial 0, where trial 1 ran with 16: the one change)" in said
    assert "to confirm: trial 1's whole configuration (cb_block_size=16), on the best measured here" in said, said

    baseline, hinted = show(tmp_path, "model-b")["trials"]
    assert baseline["params"] == {"cb_block_size": 32} and baseline["outcome"] == "ok", baseline
    assert hinted["params"] == {"cb_block_size": 16} and hinted["outcome"] == "ok", hinted
    assert hinted["proposed"] == {**hinted["proposed"], "by": "warm-start", "study": "model-a", "trial": 1}
    # The engine's refusal is known here without being paid for again: a probe from this study's
    # best down to 2 is refused as after a failed probe of its own; the study's own trials, which
    # never ran 2, do not lift it.
    study = optuna.load_study(study_name="model-b", storage=f"sqlite:///{tmp_path}/studies.db")
    prior = warm_start.restore(study.user_attrs[warm_start.ATTR]).prior
    space = {"cb_block_size": CategoricalDistribution([2, 16, 32])}
    moves = prior.failed_moves(space, [t.params for t in study.trials])
    assert [(m.param, m.before, m.after, m.kind) for m in moves] == [("cb_block_size", 16, 2, "invalid-argument")]
    assert refused(moves, space, "cb_block_size", 2, 32) and not refused(moves, space, "cb_block_size", 16, 32)
    assert not refused(failed_moves(study.trials, space), space, "cb_block_size", 2, 32)  # a cold start's
