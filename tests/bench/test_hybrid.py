"""pasu bench hybrid's command line: which upload encoding each network profile uses."""

from __future__ import annotations

import pytest

from pasu.bench.hybrid import upload_encodings

PROFILES = ["wifi", "5g", "poor"]


def test_one_encoding_for_every_profile():
    assert upload_encodings("flac", PROFILES) == {"wifi": "flac", "5g": "flac", "poor": "flac"}


def test_per_profile_encodings_leave_the_rest_uncompressed():
    assert upload_encodings("poor=opus, 5g=flac", PROFILES) == {"wifi": "pcm16", "5g": "flac", "poor": "opus"}


@pytest.mark.parametrize("spec, message", [("mp3", "'mp3' is not one of"), ("lte=opus", "names profile 'lte'"),
                                           ("poor=wav", "'wav' is not one of")])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(SystemExit, match=message):
        upload_encodings(spec, PROFILES)
