"""Sizes of memory given with their unit (dprobe.core.units): bytes in, bytes out; a bare small number refused."""

from __future__ import annotations

import argparse

import pytest

from dprobe.core.units import BARE_BYTES_MIN, format_bytes, parse_bytes, size_arg


@pytest.mark.parametrize("text, expected", [
    ("80GB", 80 * 10**9), ("80 GB", 80 * 10**9), ("80gb", 80 * 10**9), ("141GiB", 141 * 2**30),
    ("0.5TB", 5 * 10**11), ("512MiB", 512 * 2**20), ("48GB", 48 * 10**9), ("80e9", 80 * 10**9),
    ("85899345920", 80 * 2**30), ("512B", 512), (80e9, 80 * 10**9), (10_000, 10_000),
])
def test_sizes_with_their_unit_are_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, message", [
    ("80", "size '80' has no unit: give one, e.g. 80GB, 141GiB or 80e9 (bytes)"),
    (141, "size 141 has no unit"),
    (str(BARE_BYTES_MIN - 1), "has no unit"),
    ("0GB", "size must be above zero, got '0GB'"),
    ("80GX", "unknown unit 'GX' in '80GX'"),
    ("80 G", "unknown unit 'G'"),
    ("lots", "must be a size with its unit"),
    ("-5GB", "must be a size with its unit"),
    (float("nan"), "must be above zero"),
    (True, "must be a size with its unit"),
])
def test_a_size_without_a_unit_or_malformed_is_refused_in_one_line(text, message):
    with pytest.raises(ValueError, match="^[^\n]*$") as exc:
        parse_bytes(text)
    assert message in str(exc.value)


def test_the_argparse_type_names_the_option(capsys):
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--gpu-memory", type=size_arg)
    assert parser.parse_args(["--gpu-memory", "141GiB"]).gpu_memory == 141 * 2**30
    with pytest.raises(SystemExit):
        parser.parse_args(["--gpu-memory", "80"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("p: error: argument --gpu-memory: size '80' has no unit")


def test_sizes_are_written_back_for_people():
    assert format_bytes(80 * 10**9) == "80 GB" and format_bytes(141 * 10**9) == "141 GB"
    assert format_bytes(141 * 2**30, binary=True) == "141 GiB" and format_bytes(512) == "512 B"
