"""The `Predictor`'s fill-mask: the likeliest tokens at each `[MASK]` by the pre-training masked-LM head,
with whole-word readings of `##` pieces."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from bert.errors import InputError
from bert.inference.common import MASK_TOKEN, require_texts
from bert.inference.core import PredictorCore, Prepared
from bert.input_lines import InputItemError
from bert.request_rules import check_top_k
from bert.tasks.common import FILL_MASK


class FillMaskMixin(PredictorCore):
    def fill_mask(self, texts: Sequence[str], top_k: int = 5, batch_size: int | None = None) -> list[dict[str, Any]]:
        """The `top_k` likeliest tokens at each `[MASK]` of each text, by the pre-training MLM head.

        Each `[MASK]` in the text (written exactly so) is one masked position; the rest is tokenized as
        usual. Returns, per text, {"sequence", "masks": [{"start", "end", "predictions": [{"token",
        "token_id", "score", "word"}, ...]}, ...]}: the probabilities (softmax over the vocabulary) in
        descending order; `start`/`end` locate the `[MASK]` in the text. Whole words: a prediction that
        continues a word (a `##` piece) reads as part of the word before the mask, so its "word" is that
        word with the piece's text appended (`"play[MASK]"` with `##ing` -> "playing"), and otherwise
        "word" is the token itself. "sequence" is the text with every mask replaced by its top
        prediction, a `##` piece joined to the word before it (the whitespace before the mask dropped).
        """
        self._require(FILL_MASK)
        check_top_k(top_k)
        return self.run_fill_mask(self.prepare_fill_mask(texts), top_k, batch_size)

    def prepare_fill_mask(self, texts: Sequence[str]) -> Prepared:
        """`texts` tokenized once for `run_fill_mask`: `[CLS] text [SEP]` with a `[MASK]` id for each `[MASK]`.
        A text without a mask, or too long, is refused when the run reaches it (`run_fill_mask`), as `fill_mask`
        refuses it, so that the server's queue answers it from the batch it joined."""
        self._require(FILL_MASK)
        require_texts(texts)
        mask_id = self._special[MASK_TOKEN]
        if mask_id is None:
            raise InputError(f"{self.source}: the vocabulary has no {MASK_TOKEN} token")
        cls_id, sep_id = self._special_ids()
        sequences, examples = [], []
        with self._lock:
            for text in texts:
                parts = text.split(MASK_TOKEN)
                ids, where = [cls_id], []
                for j, part in enumerate(parts):
                    ids += self.tokenizer.encode(part)
                    if j < len(parts) - 1:
                        where.append(len(ids))
                        ids.append(mask_id)
                ids.append(sep_id)
                sequences.append((ids, [0] * len(ids)))
                examples.append((text, where, self._fill_mask_refusal(len(parts), len(ids))))
        return Prepared(sequences, len(texts), examples=examples)

    def _fill_mask_refusal(self, parts: int, tokens: int) -> str | None:
        """Why a text split into `parts` at its masks, of `tokens` tokens, does not run (None: it runs)."""
        if parts == 1:
            return f"no {MASK_TOKEN} in the text; write {MASK_TOKEN} where a word is to be guessed"
        if tokens > self.max_seq_length:
            return (
                f"{tokens} tokens with [CLS] and [SEP], more than max_seq_length={self.max_seq_length}; "
                "shorten the text around its masks"
            )
        return None

    def run_fill_mask(self, prepared: Prepared, top_k: int = 5, batch_size: int | None = None) -> list[dict[str, Any]]:
        """`fill_mask`'s results of texts `prepare_fill_mask` prepared; the first text refused fails the call."""
        check_top_k(top_k)
        for i, (_, _, refusal) in enumerate(prepared.examples):
            if refusal is not None:
                raise InputItemError(i, refusal)
        positions = [where for _, where, _ in prepared.examples]

        def predict(ids, mask, types, idx):
            rows = [b for b, i in enumerate(idx) for _ in positions[i]]
            if self.backend == "onnx":  # the exported graph's head runs at every position
                cols = [p for i in idx for p in positions[i]]
                logits = self.model(ids, mask, types).mlm_logits[rows, cols]  # [B, T, V] -> [M, V]
            else:  # the last block and the head at the masks only; a row with fewer masks repeats its last one
                most = max(len(positions[i]) for i in idx)
                at = [positions[i] + positions[i][-1:] * (most - len(positions[i])) for i in idx]
                hidden = self.encoder(ids, mask, types, output_positions=torch.tensor(at, device=ids.device))
                slots = [j for i in idx for j in range(len(positions[i]))]
                logits = self.model.cls.predictions(hidden.sequence_output[rows, slots])  # [B, P, H] -> [M, V]
            probs = torch.softmax(logits.float(), dim=-1)  # [M, V]
            values, tokens = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # [M, k]
            values, tokens = values.cpu().tolist(), tokens.cpu().tolist()
            out, m = [], 0
            for i in idx:
                n = len(positions[i])
                out.append(list(zip(tokens[m : m + n], values[m : m + n])))
                m += n
            return out

        with self._lock:
            found = self._run(prepared.sequences, predict, batch_size)
        return [self._fill_result(text, per_mask) for (text, _, _), per_mask in zip(prepared.examples, found)]

    def _fill_result(self, text: str, per_mask: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
        inv = self.tokenizer.inv_vocab
        masks = []
        sequence = ""
        pos = 0
        for token_ids, scores in per_mask:
            start = text.index(MASK_TOKEN, pos)
            sequence += text[pos:start]
            before = _last_word(sequence.rstrip())
            predictions: list[dict[str, Any]] = []
            for token_id, score in zip(token_ids, scores):
                token = inv.get(token_id, f"[{token_id}]")
                word = before + token[2:] if token.startswith("##") else token
                predictions.append({"token": token, "token_id": token_id, "score": score, "word": word})
            top = predictions[0]["token"]
            sequence = sequence.rstrip() + top[2:] if top.startswith("##") else sequence + top
            pos = start + len(MASK_TOKEN)
            masks.append({"start": start, "end": pos, "predictions": predictions})
        return {"sequence": sequence + text[pos:], "masks": masks}


def _last_word(text: str) -> str:
    """The non-space characters that end `text` ("" when it ends in a space or is empty)."""
    match = re.search(r"\S*$", text)
    assert match is not None  # `\S*$` matches every string, if only the empty end
    return match.group(0)
