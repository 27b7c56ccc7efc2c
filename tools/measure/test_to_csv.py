"""The committed H100 and third-lease H200 rows are what to_csv.py makes of the raw JSON lines the device returned:
rerun it into a scratch folder and compare every file byte for byte. Plain python3, no torch.

Run: python3 -m unittest discover -s tools/measure -p 'test_*.py'
"""
import csv
import filecmp
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "h100")
sys.path.insert(0, HERE)

import measure  # noqa: E402
import to_csv  # noqa: E402


class ToCsv(unittest.TestCase):
    def check_folder(self, folder, runs, date=None):
        data = os.path.join(HERE, "..", "..", "tests", "data", folder)
        raw = os.path.join(data, "raw")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, folder)
            to_csv.main(out, [os.path.join(raw, r) for r in runs], date=date)
            for name in (f"{folder}-2026-11.csv", f"{folder}-2026-11-oom.csv"):
                with self.subTest(file=name):
                    self.assertTrue(filecmp.cmp(os.path.join(out, name), os.path.join(data, name), shallow=False))
            made = sorted(os.listdir(os.path.join(out, "configs")))
            self.assertEqual(made, sorted(os.listdir(os.path.join(data, "configs"))))
            for name in made:
                with self.subTest(config=name):
                    self.assertTrue(filecmp.cmp(os.path.join(out, "configs", name),
                                                os.path.join(data, "configs", name), shallow=False))

    def test_the_committed_rows_are_the_raw_lines_converted(self):
        # The first two leases' lines predate measure.py's `date` field: the date is the lease's.
        self.check_folder("h100", [f"h100-run{n}.jsonl" for n in (1, 2, 3)], date="2026-11-27")

    def test_the_third_leases_rows_are_its_raw_lines_converted(self):
        self.check_folder("h200b", ["h200b-run1.jsonl", "h200b-run2.jsonl", "h200b-run3.jsonl"])

    def test_the_fourth_leases_rows_are_its_raw_lines_converted(self):
        """h200c: the traced reruns are not rows, and foreach AdamW is scored as `adamw`."""
        self.check_folder("h200c", ["h200c-run1.jsonl", "h200c-run2.jsonl", "h200c-run3.jsonl", "h200c-run4.jsonl"])
        rows = {r["id"]: r for r in csv.DictReader(open(os.path.join(HERE, "..", "..", "tests", "data", "h200c",
                                                                       "h200c-2026-11.csv")))}
        self.assertEqual([i for i in rows if i.endswith("-trace")],
                         ["h200c-mistral-7b-v03-lora8-eager-fp16-b2-4k-gc-trace"])  # not a rerun
        foreach = rows["h200c-qwen3-1.7b-ft-amp-b4-2k-gc-foreach"]
        self.assertEqual(foreach["optimizer"], "adamw")
        self.assertIn("_multi_tensor_adam", foreach["notes"])
        self.assertIn("_single_tensor_adam", rows["h200c-qwen25-1.5b-ft-bf16-b2-1k"]["notes"])

    def test_the_fifth_leases_rows_are_its_raw_lines_converted(self):
        """h200d: the two traced reruns are not rows (one reruns an h200c case)."""
        self.check_folder("h200d", ["h200d-run1.jsonl", "h200d-run2.jsonl", "h200d-run3.jsonl", "h200d-run4.jsonl"])
        rows = {r["id"]: r for r in csv.DictReader(open(os.path.join(HERE, "..", "..", "tests", "data", "h200d",
                                                                       "h200d-2026-11.csv")))}
        self.assertEqual(len(rows), 51)
        self.assertNotIn("h200d-gemma2-2b-ft-bf16-b4-2k-gc-trace", rows)
        self.assertIn("_multi_tensor_adam", rows["h200d-qwen3-8b-ft-bf16-b1-4k-gc"]["notes"])

    def test_the_sixth_leases_rows_are_its_raw_lines_converted(self):
        """h200e: the four traced reruns are not rows (two rerun h200d cases)."""
        self.check_folder("h200e", ["h200e-run1.jsonl", "h200e-run2.jsonl", "h200e-run3.jsonl"])
        rows = {r["id"]: r for r in csv.DictReader(open(os.path.join(HERE, "..", "..", "tests", "data", "h200e",
                                                                       "h200e-2026-11.csv")))}
        self.assertEqual(len(rows), 52)
        self.assertFalse([i for i in rows if i.endswith("-trace")])
        self.assertIn("_fused_adam", rows["h200e-qwen3-4b-ft-bf16-fused-b4-2k-gc"]["notes"])

    def test_a_row_whose_allocator_retried_keeps_only_its_allocated_counter(self):
        import csv
        rows = {r["id"]: r for r in csv.DictReader(open(os.path.join(DATA, "h100-2026-11.csv")))}
        cut = rows["h100-llama32-1b-b256-512"]
        self.assertEqual((cut["max_reserved_gib"], cut["nvml_gib"], cut["measured_gib"]), ("", "", ""))
        self.assertNotEqual(cut["max_allocated_gib"], "")
        self.assertIn("retried", cut["notes"])


class Cases(unittest.TestCase):
    def test_case_ids_are_unique_and_each_config_names_its_model_type(self):
        ids = [c["id"] for c in measure.CASES]
        self.assertEqual(len(ids), len(set(ids)))
        for c in measure.CASES:
            self.assertIn("model_type", c["cfg"], c["id"])
            self.assertGreater(c["gib"], 0, c["id"])


if __name__ == "__main__":
    unittest.main()
