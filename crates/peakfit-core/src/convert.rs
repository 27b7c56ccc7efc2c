//! Named numeric conversions: every float-to-integer and narrowing integer conversion in peakfit
//! goes through here, so what happens at the edges is said once and clippy's cast lints stay on
//! everywhere else. Pure functions; nothing else lives here.
//!
//! All of them saturate: a value above the target's range becomes its maximum, below it its
//! minimum, NaN becomes 0, and a float's fraction is dropped (round first where that is wanted).
//! For floats that is exactly what Rust's `as` does; the names make it a visible decision.

/// `x` as `u64`, saturating (NaN and negatives give 0).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "saturating by definition"
)]
pub fn f64_to_u64(x: f64) -> u64 {
    x as u64
}

/// `x` as `usize`, saturating (NaN and negatives give 0).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "saturating by definition"
)]
pub fn f64_to_usize(x: f64) -> usize {
    x as usize
}

/// `x` as `u32`, saturating (NaN and negatives give 0).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "saturating by definition"
)]
pub fn f64_to_u32(x: f64) -> u32 {
    x as u32
}

/// `x` as `u8`, saturating (NaN and negatives give 0).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "saturating by definition"
)]
pub fn f64_to_u8(x: f64) -> u8 {
    x as u8
}

/// `x` as `i64`, saturating (NaN gives 0).
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "saturating by definition")]
pub fn f64_to_i64(x: f64) -> i64 {
    x as i64
}

/// `x` as `u32`, saturating at `u32::MAX` (counts of GPUs, devices, processes).
#[must_use]
pub fn usize_to_u32(x: usize) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// `x` as `usize`, saturating at `usize::MAX` (only a 32-bit target can saturate).
#[must_use]
pub fn u64_to_usize(x: u64) -> usize {
    usize::try_from(x).unwrap_or(usize::MAX)
}

/// `x` as `u32`, saturating at `u32::MAX`.
#[must_use]
pub fn u64_to_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// `x` as `i64`, saturating at `i64::MAX`.
#[must_use]
pub fn u64_to_i64(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_saturate_at_both_ends_and_nan_is_zero() {
        assert_eq!(f64_to_u64(-1.0), 0);
        assert_eq!(f64_to_u64(f64::NAN), 0);
        assert_eq!(f64_to_u64(1e30), u64::MAX);
        assert_eq!(f64_to_u64(2.9), 2);
        assert_eq!(f64_to_u8(300.0), u8::MAX);
        assert_eq!(f64_to_u32(-0.5), 0);
        assert_eq!(f64_to_usize(7.5), 7);
        assert_eq!(f64_to_i64(-1e30), i64::MIN);
        assert_eq!(f64_to_i64(f64::NAN), 0);
    }

    #[test]
    fn integers_saturate_at_the_target_maximum() {
        assert_eq!(usize_to_u32(usize::MAX), u32::MAX);
        assert_eq!(usize_to_u32(5), 5);
        assert_eq!(u64_to_u32(u64::MAX), u32::MAX);
        assert_eq!(u64_to_i64(u64::MAX), i64::MAX);
        assert_eq!(u64_to_i64(9), 9);
        assert_eq!(u64_to_usize(9), 9);
    }
}
