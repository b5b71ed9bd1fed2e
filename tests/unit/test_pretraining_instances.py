"""The original's pre-training-data algorithm (`bert.pretraining.instances`, create_pretraining_data.py); the
fixtures of the original's output are checked in tests/parity/test_pretraining_data_fixtures.py."""

import random

from bert.pretraining.instances import create_masked_lm_predictions
from conftest import PIECES_VOCAB


def test_original_masking_wwm_groups_pieces_across_sep():
    # The quirk the streaming mode keeps: a "##" piece starting B joins the last word of A.
    tokens = ["[CLS]", "walk", "[SEP]", "##ing", "[SEP]"]
    _, positions, _ = create_masked_lm_predictions(
        tokens, 0.5, 5, PIECES_VOCAB, random.Random(3), do_whole_word_mask=True
    )
    assert positions == [1, 3]  # one group of 2 = the whole budget round(5 * 0.5)
