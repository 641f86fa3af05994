#!/usr/bin/env python3
"""Tests of scripts/check-claims.py on small made-up trees (README, docs, receipts).

Run: python3 scripts/test_check_claims.py   (standard library only)
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-claims.py")

BENCH = {
    "git_dirty": False,
    "outcome": {
        "decode_tokens_per_s": 226.73,
        "percent_of_copy_bandwidth": 80.41,
        "max_abs_error": 0.0018,
        "median_ms": 0.16031,
        "fraction_of_copy_bandwidth": 0.8270,
        "prefill_tokens_per_s": 18600.28,
        "prompt_tokens": 512,
    },
}


class CheckClaims(unittest.TestCase):
    def run_on(self, readme, receipts, docs=None):
        """Runs the script on a tree holding `readme`, `docs` ({path: text}) and
        `receipts` ({name: object, or a str written as is}); returns (rc, output)."""
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "receipts"))
            for name, body in receipts.items():
                path = os.path.join(root, "receipts", name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(body if isinstance(body, str) else json.dumps(body))
            with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(readme))
            for name, text in (docs or {}).items():
                path = os.path.join(root, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(textwrap.dedent(text))
            p = subprocess.run(
                [sys.executable, SCRIPT, root], capture_output=True, text=True, encoding="utf-8"
            )
            self.assertEqual(p.stderr, "")
            return p.returncode, p.stdout

    def test_held_claims_pass(self):
        rc, out = self.run_on(
            """\
            # t

            Decode runs at 226.7 tokens/s, 80.4% of copy, max error 1.8e-3; the head
            takes 160 µs, 82.7% of copy; 512 tokens at 18,600 tokens/s
            ([bench](receipts/bench.json)). The llama-3.1-8b shape (8192×8192, `gemv 999`)
            is named, not measured ([bench](receipts/bench.json)).

            | model | decode | target | receipts |
            |---|---|---|---|
            | qwen2.5-0.5b | 226.7 tokens/s, 80.4% | 999% | [bench](receipts/bench.json) |
            """,
            {"bench.json": BENCH},
        )
        self.assertEqual(rc, 0, out)
        self.assertIn("claims: 9 numbers checked against 1 receipts, 0 failures", out)

    def test_wrong_number_fails(self):
        rc, out = self.run_on(
            """\
            Decode runs at 226.7 tokens/s
            and 81.4% of copy ([bench](receipts/bench.json)).
            """,
            {"bench.json": BENCH},
        )
        self.assertEqual(rc, 1, out)
        self.assertIn('README.md:2: "81.4%" not in receipts/bench.json (nearest: 80.41', out)
        self.assertIn("claims: 2 numbers checked against 1 receipts, 1 failures", out)

    def test_number_after_the_receipt_is_not_its_claim(self):
        rc, out = self.run_on(
            "Decode runs at 226.7 tokens/s ([bench](receipts/bench.json)); the next run 1235.\n",
            {"bench.json": BENCH},
        )
        self.assertEqual(rc, 0, out)

    def test_colon_after_the_receipt_vouches_for_what_follows(self):
        rc, out = self.run_on(
            "Outcome ([bench](receipts/bench.json)): 226.7 tokens/s and 1235 tokens/s.\n",
            {"bench.json": BENCH},
        )
        self.assertEqual(rc, 1, out)
        self.assertIn('"1235" not in receipts/bench.json', out)

    def test_table_row_without_receipt_takes_the_caption_s(self):
        rc, out = self.run_on(
            """\
            Beside PyTorch ([bench](receipts/bench.json)):

            <!-- claims: not-measured 5.17 -->
            | engine | tokens/s |
            |---|---|
            | quench | 226.7 |
            | transformers 5.17 | 1235 |
            """,
            {"bench.json": BENCH},
        )
        self.assertEqual(rc, 1, out)
        self.assertIn('README.md:7: "1235" not in receipts/bench.json', out)
        self.assertNotIn('"5.17"', out)

    def test_dirty_receipt_linked_from_readme_fails(self):
        dirty = dict(BENCH, git_dirty=True)
        rc, out = self.run_on(
            "Decode runs at 226.7 tokens/s ([bench](receipts/bench.json)).\n",
            {"bench.json": dirty},
        )
        self.assertEqual(rc, 1, out)
        self.assertIn('README.md:1: receipts/bench.json has "git_dirty": true', out)

    def test_dirty_receipt_linked_from_docs_only_passes(self):
        dirty = dict(BENCH, git_dirty=True)
        rc, out = self.run_on(
            "See the docs.\n",
            {"bench.json": dirty},
            {"docs/perf/notes.md": "Decode: 226.7 tokens/s ([bench](../../receipts/bench.json)).\n"},
        )
        self.assertEqual(rc, 0, out)

    def test_receipt_without_git_dirty_is_counted_not_failed(self):
        old = {k: v for k, v in BENCH.items() if k != "git_dirty"}
        rc, out = self.run_on(
            "Decode runs at 226.7 tokens/s ([bench](receipts/old.json)).\n", {"old.json": old}
        )
        self.assertEqual(rc, 0, out)
        self.assertIn("1 of the README's receipts record no git_dirty field", out)

    def test_missing_receipt_fails(self):
        rc, out = self.run_on(
            "Decode runs at 226.7 tokens/s ([bench](receipts/gone.json)).\n", {"bench.json": BENCH}
        )
        self.assertEqual(rc, 1, out)
        self.assertIn("README.md:1: receipts/gone.json does not exist", out)

    def test_bare_path_in_docs_is_a_citation(self):
        rc, out = self.run_on(
            "Nothing here.\n",
            {"bench.json": BENCH},
            {"docs/serve.md": "Measured at 227.7 tokens/s (receipts/bench.json).\n"},
        )
        self.assertEqual(rc, 1, out)
        self.assertIn('docs/serve.md:1: "227.7" not in receipts/bench.json', out)

    def test_invalid_json_fails(self):
        rc, out = self.run_on(
            "Decode runs at 226.7 tokens/s ([bench](receipts/bench.json)).\n", {"bench.json": "{"}
        )
        self.assertEqual(rc, 1, out)
        self.assertIn("receipts/bench.json is not valid JSON", out)


if __name__ == "__main__":
    unittest.main()
