"""The text benchmark's plan and models: how many prompts a run takes, and at which precision every row's model loads."""

from __future__ import annotations

from specgen.eval.text_bench import HUMANEVAL_LIMIT, TextBenchConfig, plan, row_models
from specgen.models.quantize import quantized_layers
from specgen.text.target import load_text_model
from tests.pcllm_fixtures import save_tiny_text, write_prompts


def test_a_prompt_set_runs_whole_by_default_and_humaneval_keeps_its_limit(tmp_path):
    prompts = write_prompts(tmp_path, [f"prompt {i}" for i in range(HUMANEVAL_LIMIT + 5)])
    assert len(plan(TextBenchConfig(suite="text", prompts=str(prompts))).items) == HUMANEVAL_LIMIT + 5
    assert len(plan(TextBenchConfig(suite="text", prompts=str(prompts), limit=3, offset=24)).items) == 1
    assert len(plan(TextBenchConfig(suite="humaneval")).items) == HUMANEVAL_LIMIT


def test_quantize_applies_to_the_distilled_target_a_row_decodes(tmp_path):
    save_tiny_text("tiny-text")
    save_tiny_text("tiny-pc", seed=1)  # a distilled target: the same tokenizer, other weights
    cfg = TextBenchConfig(suite="text", prompts=str(write_prompts(tmp_path)), model="tiny-text",
                          methods=["ar", "pcllm", "ar@tiny-text+int8"], targets={"pcllm": "tiny-pc"}, quantize="int4")
    model = load_text_model("tiny-text", quantize="int4")
    models = row_models(model, plan(cfg))
    assert set(models) == {"tiny-text", "tiny-pc", "tiny-text+int8"}
    assert models["tiny-pc"].precision == "int4" and quantized_layers(models["tiny-pc"].module)
    assert models["tiny-text+int8"].precision == "int8"  # a row's own precision suffix wins


def test_a_run_warms_its_shortest_and_longest_prompts_first():
    """The warm-up decodes reach the cache widths the timed items will (on CUDA their steps captured before timing,
    while a run captures: `GraphUse.warm_up`); a CPU takes the first alone."""
    from specgen.eval.text_bench import warm_prompts

    prompts = [[1] * 40, [2] * 300, [3] * 9, [4] * 120]
    assert warm_prompts(prompts) == [[3] * 9, [2] * 300, [1] * 40, [4] * 120]
    assert warm_prompts([[5] * 3]) == [[5] * 3]
