//! The peak-memory model's reserved bytes (`max_memory_reserved`: tensors plus the caching
//! allocator's slack) against two references: the oracle's replay of each run's allocations
//! through a model of PyTorch's CUDA caching allocator (`tests/data/oracle-reserved.csv`, a
//! spread sample of the grid; `tools/oracle/allocator.py`, `docs/oracle.md`, "Reserved memory")
//! and the H200 rows' measured `max_reserved` (`tests/data/h200`). No torch here.
//!
//! What it holds the model to: no H200 row's reserved more than `H200_FLOOR` percent low (the
//! lowest today, so a change to the slack term cannot make a measured row lower), and no
//! oracle-reserved row more than 5 % low unless `KNOWN_GAPS` names it with the mechanism the
//! model lacks and the lowest it may read. The bands are printed per source (median, p90, signed median, lowest).

mod model_rows;

use model_rows::percentile;
use peakfit::model::quantity::GIB;
use peakfit::model::{Spec, estimate};

/// The lowest signed reserved error over the H200 rows with the slack of `hf::slack` (−3.9 %,
/// the qwen2.5-0.5b fine-tune b8 × 1k with checkpointing; `cargo nextest run -E
/// 'binary(estimate_reserved)' --no-capture`), rounded down.
const H200_FLOOR: f64 = -5.0;

/// Oracle-reserved rows the model reads more than 5 % low, by id, with the lowest error each may
/// read (today's, rounded down) and what the replay shows: blocks stranded by the allocator's best
/// fit (`get_free_block`, `should_split`), which a number of largest tensors does not follow.
/// Reported, not hidden (they are in the bands); a row that falls below its floor fails, and so
/// does one that is no longer more than 5 % low, so the list follows the model.
const KNOWN_GAPS: &[(&str, f64, &str)] = &[(
    "bert-base-uncased-inference-fp32-b1-t128",
    -9.0,
    "0.04 GiB: free room in the weights' 2 MiB and 20 MiB segments",
)];

/// Long generations (`oracle-reserved-long.csv`), with the lowest each may read (today's, rounded
/// down): every 2 MiB crossing of a layer's key and value after the first decode step makes
/// segments of the grown size and strands the previous ones (`docs/oracle.md`, "Decode past the
/// first step"). These rows carry the default annotations, which do not say how many tokens a pod
/// generates, so `hf::cache_crossings_fresh` counts one crossing; with `prompt-tokens` it counts
/// them all. The replay also makes 6–7 segments per crossing where an H200 trace of the same
/// workloads made 2 (the real rows read −3.6 and −9.3 % on these annotations, +0.6 % at 256 with
/// the prompt stated), so part of the gap is the replay's. Held here so that it cannot grow unseen;
/// a row that is no longer more than 5 % low must leave the list.
const LONG_GENERATION_FLOORS: &[(&str, f64)] = &[
    ("qwen3-0.6b-inference-bf16-b32-t8192-n128", -14.0),
    ("qwen3-0.6b-inference-bf16-b32-t8192-n256", -28.0),
];

/// The lowest the other long generations may read: Whisper decoding its whole window, whose
/// self-attention copies cross 2 MiB sizes past 10 MiB (`hf::seq2seq_crossings`).
const LONG_GENERATION_LOWEST: f64 = -3.0;

/// A row scored: id, workload, reference GiB, model GiB, signed error in percent.
type Scored = (String, String, f64, f64, f64);

fn score(id: &str, workload: &str, spec: &Spec, reference: f64) -> Scored {
    let model = estimate(spec, 141 << 30).reserved_bytes as f64 / GIB;
    (
        id.to_string(),
        workload.to_string(),
        reference,
        model,
        (model - reference) / reference * 100.0,
    )
}

/// Median and p90 of |error|, signed median and lowest, in percent.
fn bands(errors: &[f64]) -> (f64, f64, f64, f64) {
    let (abs, signed) = model_rows::sorted_errors(errors);
    (
        percentile(&abs, 0.5),
        percentile(&abs, 0.9),
        percentile(&signed, 0.5),
        signed[0],
    )
}

fn print_bands(label: &str, errors: &[f64]) {
    let (median, p90, signed, min) = bands(errors);
    println!(
        "{label:<34} {:>4} rows  median {median:>5.1}%  p90 {p90:>5.1}%  signed {signed:>+6.1}%  min {min:>+6.1}%",
        errors.len()
    );
}

#[test]
fn long_generations_stay_within_their_known_gap() {
    let rows = model_rows::oracle_reserved_long();
    assert!(rows.len() >= LONG_GENERATION_FLOORS.len());
    for r in rows {
        let (id, _, reference, model, error) = score(&r.id, &r.workload, &r.spec, r.oracle_gib);
        println!("{id}: replay {reference:.2} GiB, model {model:.2} ({error:+.1}%)");
        let Some((_, floor)) = LONG_GENERATION_FLOORS.iter().find(|(i, _)| *i == id) else {
            assert!(
                error >= LONG_GENERATION_LOWEST,
                "{id}: {error:+.1}% below {LONG_GENERATION_LOWEST}%"
            );
            continue;
        };
        assert!(
            error >= *floor,
            "{id}: {error:+.1}% below its floor {floor}%"
        );
        assert!(
            error < -5.0,
            "{id}: {error:+.1}%, no longer a gap; take it out of LONG_GENERATION_FLOORS"
        );
    }
}

#[test]
fn reserved_against_the_allocator_replay_and_the_h200_rows() {
    let oracle = model_rows::oracle_reserved();
    assert!(
        oracle.len() >= 40,
        "oracle-reserved.csv has {} rows",
        oracle.len()
    );
    let mut scored: Vec<Scored> = oracle
        .iter()
        .map(|r| score(&r.id, &r.workload, &r.spec, r.oracle_gib))
        .collect();
    let h200: Vec<Scored> = model_rows::h200()
        .iter()
        .map(|r| score(&r.id, &r.workload, &r.spec, r.max_reserved))
        .collect();
    for (label, rows) in [
        ("oracle reserved sample", &scored),
        ("H200 max_reserved", &h200),
    ] {
        let all: Vec<f64> = rows.iter().map(|r| r.4).collect();
        print_bands(label, &all);
        for workload in ["inference", "training", "lora"] {
            let errors: Vec<f64> = rows
                .iter()
                .filter(|r| r.1 == workload)
                .map(|r| r.4)
                .collect();
            if !errors.is_empty() {
                print_bands(&format!("  {workload}"), &errors);
            }
        }
    }
    println!("H200 rows: measured reserved / model (GiB):");
    for r in &h200 {
        println!("  {:<40} {:>8.3} {:>8.3} {:>+6.1}%", r.0, r.2, r.3, r.4);
    }
    scored.sort_by(|a, b| a.4.total_cmp(&b.4));
    println!("oracle reserved sample, lowest first: oracle reserved / model (GiB):");
    for r in &scored {
        println!("  {:<58} {:>8.3} {:>8.3} {:>+6.1}%", r.0, r.2, r.3, r.4);
    }
    for r in &h200 {
        assert!(
            r.4 >= H200_FLOOR,
            "{}: reserved {:.1}% low, below the floor of {H200_FLOOR}%",
            r.0,
            r.4
        );
    }
    for r in &scored {
        if let Some((_, floor, _)) = KNOWN_GAPS.iter().find(|(id, ..)| r.0 == *id) {
            assert!(
                r.4 >= *floor,
                "{}: the model's reserved is {:.1}% below the allocator replay, under its \
                 known gap's floor of {floor}%",
                r.0,
                r.4
            );
            assert!(
                r.4 < -5.0,
                "{}: {:+.1}%, no longer more than 5 % low: take it out of KNOWN_GAPS",
                r.0,
                r.4
            );
            continue;
        }
        assert!(
            r.4 >= -5.0,
            "{}: the model's reserved is {:.1}% below the allocator replay",
            r.0,
            r.4
        );
    }
    for (id, ..) in KNOWN_GAPS {
        assert!(
            scored.iter().any(|r| r.0 == *id),
            "{id}: in KNOWN_GAPS but not in oracle-reserved.csv"
        );
    }
}
