"""Checkpoint key maps between the original TF variable names and ours.

Our parameter names are transformers' names, so a transformers checkpoint needs no map at all (only
the legacy `gamma`/`beta` spellings of pytorch-pretrained-bert). The TF map is a scope rename, written
as data: an ordered list of (TF pattern, our pattern) rules, plus the one rule of the TF layout that
is not a rename: dense `kernel`s are stored [in, out] and must be transposed into `nn.Linear.weight`
[out, in]. The explicit `output_weights` variables of the heads are already [out, in].
"""

from __future__ import annotations

import logging
import re

import numpy as np

logger = logging.getLogger(__name__)

# (TF regex, our replacement) tried in order; `{n}` style groups carry layer numbers across.
TF_TO_OURS: list[tuple[str, str]] = [
    (r"^bert/embeddings/(word|position|token_type)_embeddings$", r"bert.embeddings.\1_embeddings.weight"),
    (r"^bert/encoder/layer_(\d+)/(.*)$", r"bert.encoder.layer.\1.\2"),
    (r"^cls/predictions/output_bias$", r"cls.predictions.bias"),
    (r"^cls/seq_relationship/output_weights$", r"cls.seq_relationship.weight"),
    (r"^cls/seq_relationship/output_bias$", r"cls.seq_relationship.bias"),
    (r"^cls/squad/output_weights$", r"qa_outputs.weight"),  # run_squad.py
    (r"^cls/squad/output_bias$", r"qa_outputs.bias"),
    (r"^output_weights$", r"classifier.weight"),  # run_classifier.py, top-level scope
    (r"^output_bias$", r"classifier.bias"),
    (r"^(bert|cls)/(.*)$", r"\1.\2"),
]
# Suffix renames applied after the scope rules: TF leaf names -> torch leaf names.
_LEAF_TO_OURS = {"kernel": "weight", "gamma": "weight", "beta": "bias"}

# Optimizer state and bookkeeping in checkpoints written during training: never model weights.
_TF_SKIP = re.compile(r"(^|/)(adam_m|adam_v|global_step|AdamWeightDecayOptimizer(_\d+)?|Momentum|beta[12]_power)$")


def is_tf_weight(name: str) -> bool:
    return not _TF_SKIP.search(name) and not name.startswith("AdamWeightDecayOptimizer")


def tf_to_ours(name: str) -> tuple[str, bool]:
    """Our parameter name for a TF variable, and whether its value must be transposed."""
    for pattern, repl in TF_TO_OURS:
        if re.match(pattern, name):
            ours = re.sub(pattern, repl, name)
            break
    else:
        raise KeyError(name)
    parts = ours.replace("/", ".").split(".")
    transpose = parts[-1] == "kernel"
    parts[-1] = _LEAF_TO_OURS.get(parts[-1], parts[-1])
    return ".".join(parts), transpose


def ours_to_tf(name: str) -> tuple[str, bool]:
    """The TF variable name for one of our parameters, and whether to transpose it (the inverse map)."""
    fixed = {
        "cls.predictions.bias": "cls/predictions/output_bias",
        "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
        "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
        "qa_outputs.weight": "cls/squad/output_weights",
        "qa_outputs.bias": "cls/squad/output_bias",
        "classifier.weight": "output_weights",
        "classifier.bias": "output_bias",
    }
    if name in fixed:
        return fixed[name], False
    m = re.match(r"^bert\.embeddings\.(word|position|token_type)_embeddings\.weight$", name)
    if m:
        return f"bert/embeddings/{m.group(1)}_embeddings", False
    parts = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", name).split(".")
    leaf = parts[-1]
    if parts[-2] == "LayerNorm":
        parts[-1] = {"weight": "gamma", "bias": "beta"}[leaf]
        return "/".join(parts), False
    if leaf == "weight":
        parts[-1] = "kernel"
        return "/".join(parts), True
    return "/".join(parts), False


def tf_variables_to_state_dict(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Map TF variables to our names (transposing kernels), dropping optimizer state."""
    out = {}
    for name, value in variables.items():
        if not is_tf_weight(name):
            continue
        try:
            ours, transpose = tf_to_ours(name)
        except KeyError:
            logger.warning("TF variable %s has no counterpart in this model; ignored", name)
            continue
        out[ours] = np.ascontiguousarray(value.T) if transpose else value
    return out


def state_dict_to_tf_variables(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in state.items():
        tf_name, transpose = ours_to_tf(name)
        out[tf_name] = np.ascontiguousarray(value.T) if transpose else value
    return out
