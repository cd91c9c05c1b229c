"""Fingerprints: noise that a person cannot see must not change them; anything
that changes the generation must."""

from __future__ import annotations

import base64
import hashlib
import io
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image, PngImagePlugin

import dispatcher.tasks.fingerprint as fingerprint_module
from dispatcher.errors import InputError
from dispatcher.profiles import DEFAULT_FINGERPRINT_FIELDS
from dispatcher.tasks.fingerprint import (
    LocalFiles,
    canonical_json,
    fingerprint,
    image_hash,
    normalize_prompt,
    read_image,
)

FIELDS = DEFAULT_FINGERPRINT_FIELDS
# Pure and cheap, but the strategies are rich: 50 examples each keep the file
# under a few seconds on a loaded 2-core machine while still exploring widely.
quick = settings(max_examples=50)
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"

# -- strategies -----------------------------------------------------------------

words = st.lists(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789,.!?-", min_size=1, max_size=8),
    min_size=1,
    max_size=8,
)
json_scalars = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=10)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
listed_params = st.fixed_dictionaries(
    {},
    optional={
        "prompt": words.map(" ".join),
        "negative_prompt": words.map(" ".join),
        "aspect_ratio": st.sampled_from(["16:9", "9:16", "1:1"]),
        "duration": st.integers(1, 20),
        "resolution": st.sampled_from(["720p", "1080p"]),
        "seed": st.integers(0, 2**32),
        "model_version": st.text(max_size=8),
        "style_preset": json_values,
    },
)
unlisted_keys = st.text(min_size=1, max_size=12).filter(
    lambda k: k not in FIELDS and k not in {"reference_image", "reference_images"}
)


@st.composite
def noisy(draw: st.DrawFn, parts: list[str]) -> str:
    """`parts` joined by random runs of whitespace and zero-width characters,
    with more of them at both ends."""
    gap = st.text(alphabet=" \t\n\r\u3000" + ZERO_WIDTH, min_size=1, max_size=4).filter(
        lambda g: any(c.isspace() for c in g)  # a gap must still separate two words
    )
    edge = st.text(alphabet=" \t\n" + ZERO_WIDTH, max_size=4)
    out = draw(edge)
    for i, part in enumerate(parts):
        # Zero-width characters may also sit inside a word.
        cut = draw(st.integers(0, len(part)))
        out += part[:cut] + draw(st.text(alphabet=ZERO_WIDTH, max_size=2)) + part[cut:]
        if i < len(parts) - 1:
            out += draw(gap)
    return out + draw(edge)


def full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


# -- prompt normalisation ------------------------------------------------------------


@quick
@given(words, st.data())
def test_prompt_noise_is_ignored(parts: list[str], data: st.DataObject) -> None:
    clean = " ".join(parts)
    noisy_prompt = data.draw(noisy(parts))
    assert normalize_prompt(noisy_prompt) == clean
    for field in ("prompt", "negative_prompt"):
        assert fingerprint("m", {field: noisy_prompt}, FIELDS) == fingerprint(
            "m", {field: clean}, FIELDS
        )


@quick
@given(words)
def test_full_width_variants_match(parts: list[str]) -> None:
    clean = " ".join(parts)
    wide = "\u3000".join(full_width(p) for p in parts)  # ideographic space too
    assert normalize_prompt(wide) == clean
    for field in ("prompt", "negative_prompt"):
        assert fingerprint("m", {field: wide}, FIELDS) == fingerprint("m", {field: clean}, FIELDS)


@quick
@given(st.text())
def test_normalize_is_idempotent_and_trimmed(text: str) -> None:
    once = normalize_prompt(text)
    assert normalize_prompt(once) == once
    assert once == once.strip()
    assert "  " not in once
    assert not any(c in once for c in ZERO_WIDTH)


# -- fingerprint --------------------------------------------------------------------


@quick
@given(listed_params, st.randoms(use_true_random=False))
def test_key_order_is_irrelevant(params: dict[str, Any], rnd: random.Random) -> None:
    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(value, list):
            return [shuffled(v) for v in value]  # list order is meaningful: kept
        return value

    fields = list(FIELDS)
    rnd.shuffle(fields)
    assert fingerprint("m", shuffled(params), fields) == fingerprint("m", params, FIELDS)


@quick
@given(listed_params, st.dictionaries(unlisted_keys, json_values, min_size=1, max_size=4))
def test_unlisted_fields_never_count(params: dict[str, Any], extra: dict[str, Any]) -> None:
    assert fingerprint("m", {**params, **extra}, FIELDS) == fingerprint("m", params, FIELDS)


@quick
@given(listed_params, st.sampled_from(FIELDS), json_values, json_values)
def test_changing_a_listed_field_changes_it(
    params: dict[str, Any], field: str, a: Any, b: Any
) -> None:
    def meaning(value: Any) -> str:
        if field in ("prompt", "negative_prompt") and isinstance(value, str):
            value = normalize_prompt(value)
        return canonical_json(value)

    # Any change that is more than noise: 1 vs 1.0 vs true all count as different.
    assume(meaning(a) != meaning(b))
    fp_a = fingerprint("m", {**params, field: a}, FIELDS)
    fp_b = fingerprint("m", {**params, field: b}, FIELDS)
    assert fp_a != fp_b


@quick
@given(listed_params, st.sampled_from(FIELDS), json_values)
def test_adding_or_removing_a_listed_field_changes_it(
    params: dict[str, Any], field: str, value: Any
) -> None:
    without = {k: v for k, v in params.items() if k != field}
    assert fingerprint("m", {**without, field: value}, FIELDS) != fingerprint("m", without, FIELDS)


@quick
@given(listed_params)
def test_model_name_counts(params: dict[str, Any]) -> None:
    assert fingerprint("a", params, FIELDS) != fingerprint("b", params, FIELDS)


def test_profile_field_list_is_respected() -> None:
    params = {"prompt": "cat", "seed": 1, "duration": 5}
    fields = ("prompt", "seed")
    assert fingerprint("m", {**params, "duration": 9}, fields) == fingerprint("m", params, fields)
    assert fingerprint("m", {**params, "seed": 2}, fields) != fingerprint("m", params, fields)


def test_result_is_the_sha256_hex_of_the_canonical_document() -> None:
    # Pinned: the result cache and dedup are keyed by it, so a change of
    # encoding would silently orphan every cached result of an upgraded host.
    fp = fingerprint("m", {"prompt": "x", "unlisted": 1}, FIELDS)
    document = b'{"fields":{"prompt":"x"},"images":{},"model":"m"}'
    assert fp == hashlib.sha256(document).hexdigest()
    assert fp == "39988cf20c361e81a8eb2f477151c7a4252b524dd14299c882738a6d302d5f7e"


def test_non_json_value_is_an_input_error() -> None:
    with pytest.raises(InputError, match="seed"):
        fingerprint("m", {"seed": float("nan")}, FIELDS)


# -- images -------------------------------------------------------------------------


def encode(img: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def with_exif(img: Image.Image) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "Some Camera Maker"  # Make
    exif[0x0131] = "editor 1.0"  # Software
    return encode(img, "JPEG", quality=90, exif=exif.tobytes())


def with_text_chunks(img: Image.Image) -> bytes:
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "made by someone")
    info.add_itxt("Description", "beschreibung \u00e9")
    return encode(img, "PNG", pnginfo=info)


@st.composite
def pictures(draw: st.DrawFn, mode: str = "RGB") -> Image.Image:
    width = draw(st.integers(1, 24))
    height = draw(st.integers(1, 24))
    channels = len(mode)
    data = draw(st.binary(min_size=width * height * channels, max_size=width * height * channels))
    return Image.frombytes(mode, (width, height), data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pictures())
def test_lossless_encodings_and_metadata_match(img: Image.Image) -> None:
    with img:
        reference = image_hash(encode(img, "PNG"))
        copies = {
            "png+text": with_text_chunks(img),
            "bmp": encode(img, "BMP"),
            "webp-lossless": encode(img, "WEBP", lossless=True),
            "tiff": encode(img, "TIFF"),
            "png-rgba-opaque": encode(img.convert("RGBA"), "PNG"),
        }
        for name, data in copies.items():
            assert image_hash(data) == reference, name


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pictures())
def test_jpeg_exif_is_metadata(img: Image.Image) -> None:
    with img:
        plain = encode(img, "JPEG", quality=90)
        assert image_hash(with_exif(img)) == image_hash(plain)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pictures("RGBA"), st.data())
def test_transparent_pixels_ignore_hidden_colour(img: Image.Image, data: st.DataObject) -> None:
    with img:
        # Make some pixels fully transparent, then paint different invisible
        # colours under them in a second copy.
        hidden = data.draw(
            st.sets(
                st.tuples(st.integers(0, img.width - 1), st.integers(0, img.height - 1)), min_size=1
            )
        )
        first, second = img.copy(), img.copy()
        for xy in hidden:
            first.putpixel(xy, (0, 0, 0, 0))
            second.putpixel(xy, (*data.draw(st.tuples(*[st.integers(0, 255)] * 3)), 0))
        with first, second:
            assert image_hash(encode(first, "PNG")) == image_hash(encode(second, "PNG"))
            # WebP lossless discards the colour under transparent pixels itself.
            webp = encode(second, "WEBP", lossless=True)
            assert image_hash(webp) == image_hash(encode(first, "PNG"))


def test_hidden_colour_ignored_when_no_resampling_happens() -> None:
    # At exactly 512 px Pillow's resize is a plain copy, so its premultiplied
    # alpha cannot hide the colour under transparent pixels; the hash must.
    rnd = random.Random(3)
    with Image.frombytes("RGBA", (512, 40), rnd.randbytes(512 * 40 * 4)) as img:
        first, second = img.copy(), img.copy()
    with first, second:
        first.putpixel((5, 5), (0, 0, 0, 0))
        second.putpixel((5, 5), (200, 10, 5, 0))
        assert image_hash(encode(first, "PNG")) == image_hash(encode(second, "PNG"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pictures(), st.data())
def test_different_pixels_differ(img: Image.Image, data: st.DataObject) -> None:
    with img:
        x = data.draw(st.integers(0, img.width - 1))
        y = data.draw(st.integers(0, img.height - 1))
        channel = data.draw(st.integers(0, 2))
        delta = data.draw(st.integers(16, 128))
        changed = img.copy()
        pixel = list(changed.getpixel((x, y)))  # type: ignore[arg-type]
        pixel[channel] = (pixel[channel] + delta) % 256
        changed.putpixel((x, y), tuple(pixel))
        with changed:
            assert image_hash(encode(changed, "PNG")) != image_hash(encode(img, "PNG"))


def test_scaled_copies_of_large_images_match_at_512() -> None:
    # The long edge is always scaled to 512, so the hash space is bounded.
    rnd = random.Random(7)
    with Image.frombytes("RGB", (900, 300), rnd.randbytes(900 * 300 * 3)) as img:
        assert image_hash(encode(img, "PNG")) == image_hash(encode(img, "BMP"))


def test_every_reference_form_gives_the_same_hash(tmp_path: Path) -> None:
    with Image.new("RGB", (7, 5), (10, 200, 30)) as img:
        raw = encode(img, "PNG")
    path = tmp_path / "ref.png"
    path.write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    forms: list[str | bytes] = [
        raw,
        str(path),
        f"file://{path}",
        b64,
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "\n".join(b64[i : i + 60] for i in range(0, len(b64), 60)),
        f"data:image/png;base64,{b64}",
    ]
    files = LocalFiles.under([tmp_path], 1024**2)
    assert len({image_hash(form, files=files) for form in forms}) == 1


def test_images_count_even_when_unlisted(tmp_path: Path) -> None:
    with Image.new("RGB", (4, 4), "red") as red, Image.new("RGB", (4, 4), "blue") as blue:
        r, b = encode(red, "PNG"), encode(blue, "PNG")
    r_bmp = tmp_path / "r.bmp"
    with Image.open(io.BytesIO(r)) as img:
        img.save(r_bmp)
    base = {"prompt": "cat"}
    fields = ("prompt",)
    files = LocalFiles.under([tmp_path], 1024**2)
    fp_red = fingerprint("m", {**base, "reference_image": base64.b64encode(r).decode()}, fields)
    assert fp_red == fingerprint("m", {**base, "reference_image": str(r_bmp)}, fields, files=files)
    fp_blue = fingerprint("m", {**base, "reference_image": base64.b64encode(b).decode()}, fields)
    assert fp_red != fp_blue
    assert fp_red != fingerprint("m", base, fields)
    # Lists keep their order; the two keys are distinct requests.
    r64, b64 = base64.b64encode(r).decode(), base64.b64encode(b).decode()
    assert fingerprint("m", {"reference_images": [r64, b64]}, fields) != fingerprint(
        "m", {"reference_images": [b64, r64]}, fields
    )
    assert fingerprint("m", {"reference_images": [r64]}, fields) != fingerprint(
        "m", {"reference_image": r64}, fields
    )
    assert fingerprint("m", {"reference_images": []}, fields) == fingerprint("m", {}, fields)
    # Listing an image key does not make its raw string count.
    assert fingerprint(
        "m", {"reference_image": str(r_bmp)}, ("reference_image",), files=files
    ) == fingerprint("m", {"reference_image": r64}, ("reference_image",))


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("cat picture, please!", "not a file in the input dirs, a data: URL or base64"),
        (base64.b64encode(b"plain text, valid base64").decode(), "not an image in a supported"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("/definitely/missing/picture.png", "no readable image file at that path"),
        ("   ", "empty"),
    ],
)
def test_bad_references_are_input_errors(ref: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        fingerprint("m", {"reference_images": [ref]}, FIELDS)
    assert "reference_images[0]" in str(info.value)


def test_a_remote_url_counts_by_its_text_and_is_never_fetched() -> None:
    url = "https://cdn.example.com/cat.png"
    one = fingerprint("m", {"reference_image": url}, FIELDS)
    assert one == fingerprint("m", {"reference_image": f"  {url} "}, FIELDS)
    assert one != fingerprint("m", {"reference_image": url + "?v=2"}, FIELDS)
    with pytest.raises(InputError, match="a remote URL cannot be read here"):
        read_image(url, "reference_image", None)


def test_truncated_image_names_the_param() -> None:
    rnd = random.Random(1)
    with Image.frombytes("RGB", (64, 64), rnd.randbytes(64 * 64 * 3)) as img:
        data = encode(img, "PNG")
    with pytest.raises(InputError, match=r"reference_image: .*not a readable image"):
        truncated = base64.b64encode(data[: len(data) // 2]).decode()
        fingerprint("m", {"reference_image": truncated}, FIELDS)


def test_reference_images_must_be_a_list() -> None:
    with pytest.raises(InputError, match="reference_images"):
        fingerprint("m", {"reference_images": "abc"}, FIELDS)


def test_unreadable_file_names_the_param(tmp_path: Path) -> None:
    folder = tmp_path / "dir.png"
    folder.mkdir()
    with pytest.raises(InputError, match="reference_image"):
        image_hash(str(folder), files=LocalFiles.under([tmp_path], 1024))


def test_animation_frames_all_count() -> None:
    def gif(colours: list[str]) -> bytes:
        frames = [Image.new("RGB", (8, 8), c) for c in colours]
        try:
            return encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
        finally:
            for frame in frames:
                frame.close()

    assert image_hash(gif(["red", "blue"])) != image_hash(gif(["red", "green"]))
    assert image_hash(gif(["red", "blue"])) == image_hash(gif(["red", "blue"]))


def test_oversized_image_is_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lowered cap stands in for a 64-megapixel picture, which is slow to build.
    monkeypatch.setattr(fingerprint_module, "MAX_IMAGE_PIXELS", 100)
    with Image.new("L", (20, 10)) as img:
        data = encode(img, "PNG")
    with pytest.raises(InputError, match=r"reference_image: image is 20x10 pixels"):
        image_hash(data)
