"""The sentence-transformers files of a trained bi-encoder, written beside its native-layout weights.

The directory is then both a model this project loads (`bert embed`, `Predictor`) and one
`sentence_transformers.SentenceTransformer(DIR)` loads: `modules.json` (Transformer at the root, then
Pooling in `1_Pooling/`, then Normalize when the vectors are normalised), `1_Pooling/config.json` (the
pooling mode), `sentence_bert_config.json` (`max_seq_length`, casing left to the tokenizer) and
`config_sentence_transformers.json` (`prompts`, `default_prompt_name`, `similarity_fn_name`: cosine).
"""

from __future__ import annotations

from typing import Any

from bert import __version__

POOLING_DIR = "1_Pooling"
_MODES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}


def sentence_transformers_files(
    pooling: str, normalize: bool, max_seq_length: int, hidden_size: int, prompts: dict[str, str] | None = None
) -> dict[str, Any]:
    """{relative path: JSON value} of the files above."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    pooling_config = {
        "word_embedding_dimension": hidden_size,
        **{mode: name == pooling for name, mode in _MODES.items()},
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    return {
        "modules.json": modules,
        f"{POOLING_DIR}/config.json": pooling_config,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "__version__": {"bert": __version__},
            "prompts": prompts or {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    }
