//! Kubernetes quantities (`20Gi`, `1.5Ti`, `512Mi`, `1e9`) and parameter counts (`8.03B`, `335M`).
//!
//! Hand-written rather than taken from `k8s_openapi::apimachinery::pkg::api::resource::Quantity`,
//! which is only a string wrapper: the scheduler needs exact bytes, and an annotation must be
//! refused with a reason (negative, overflow, unknown suffix) rather than silently rounded.

/// Why a quantity or count was refused. The message is what follows "allowed:" in an
/// [`AnnotationError`](super::AnnotationError), so it says what *is* accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty value; expected {0}")]
    Empty(&'static str),
    #[error("negative values are not allowed; expected {0}")]
    Negative(&'static str),
    #[error("{0:?} is not a number; expected {1}")]
    NotANumber(String, &'static str),
    #[error("unknown suffix {0:?}; expected {1}")]
    UnknownSuffix(String, &'static str),
    #[error("too large (over 2^64-1); expected {0}")]
    Overflow(&'static str),
}

const BYTES_HELP: &str = "a Kubernetes quantity such as 20Gi, 512Mi, 1.5Ti, 20G, 1e9 or a plain \
     byte count (binary suffixes Ki Mi Gi Ti Pi Ei, decimal k M G T P E)";
const COUNT_HELP: &str = "a count such as 8.03B, 335M, 7B, 1.1T, 12K or a plain integer";

/// Parses a Kubernetes quantity into bytes, rounding a fractional byte up (never under-reserve).
pub fn parse_bytes(input: &str) -> Result<u64, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty(BYTES_HELP));
    }
    let (number, suffix) = split_number(s);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        // Kubernetes' milli suffix is legal but meaningless for bytes below 1000m.
        "m" => 1e-3,
        other => return Err(QuantityError::UnknownSuffix(other.into(), BYTES_HELP)),
    };
    let value = parse_number(number, BYTES_HELP)? * multiplier;
    to_u64(value, BYTES_HELP)
}

/// Parses a parameter count: `8.03B` = 8.03e9. `K M B T` (case-insensitive, `G` accepted for
/// billion as some model cards write it).
pub fn parse_count(input: &str) -> Result<u64, QuantityError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty(COUNT_HELP));
    }
    let (number, suffix) = split_number(s);
    let multiplier = match suffix.to_ascii_uppercase().as_str() {
        "" => 1.0,
        "K" => 1e3,
        "M" => 1e6,
        "B" | "G" => 1e9,
        "T" => 1e12,
        _ => return Err(QuantityError::UnknownSuffix(suffix.into(), COUNT_HELP)),
    };
    let value = parse_number(number, COUNT_HELP)? * multiplier;
    // A count is whole: 8.03B is exact, 1.5 (no suffix) is nonsense.
    if suffix.is_empty() && value.fract() != 0.0 {
        return Err(QuantityError::NotANumber(input.into(), COUNT_HELP));
    }
    to_u64(value.round(), COUNT_HELP)
}

/// Splits `1.5Gi` into (`1.5`, `Gi`). An exponent (`1e9`, `2E3`) stays in the number: `E` alone
/// is exa, but `E` followed by a digit or sign is an exponent, as in Kubernetes.
fn split_number(s: &str) -> (&str, &str) {
    let bytes = s.as_bytes();
    let mut end = 0;
    while end < bytes.len() {
        let c = bytes[end];
        let exponent = (c == b'e' || c == b'E')
            && end > 0
            && bytes
                .get(end + 1)
                .is_some_and(|n| n.is_ascii_digit() || *n == b'+' || *n == b'-');
        if c.is_ascii_digit() || c == b'.' || c == b'+' || c == b'-' || exponent {
            if exponent {
                end += 1;
            }
            end += 1;
        } else {
            break;
        }
    }
    (&s[..end], &s[end..])
}

fn parse_number(number: &str, help: &'static str) -> Result<f64, QuantityError> {
    if number.starts_with('-') {
        return Err(QuantityError::Negative(help));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| QuantityError::NotANumber(number.into(), help))?;
    if !value.is_finite() {
        return Err(QuantityError::Overflow(help));
    }
    if value < 0.0 {
        return Err(QuantityError::Negative(help));
    }
    Ok(value)
}

fn to_u64(value: f64, help: &'static str) -> Result<u64, QuantityError> {
    let rounded = value.ceil();
    // u64::MAX as f64 rounds up to 2^64, so `>=` is the overflow test.
    if !rounded.is_finite() || rounded >= u64::MAX as f64 {
        return Err(QuantityError::Overflow(help));
    }
    Ok(crate::convert::f64_to_u64(rounded))
}

/// Bytes as GiB with two decimals, for tables and messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB)
}

pub const GIB: f64 = 1_073_741_824.0;
pub const MIB: f64 = 1_048_576.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("20Gi"), Ok(20 << 30));
        assert_eq!(parse_bytes("20G"), Ok(20_000_000_000));
        assert_eq!(parse_bytes("1.5Ti"), Ok(3 << 39));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("2E3"), Ok(2000));
        assert_eq!(parse_bytes("1E"), Ok(1_000_000_000_000_000_000));
        assert_eq!(parse_bytes("12345"), Ok(12345));
        assert_eq!(parse_bytes(" 4Ki "), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("1500m"), Ok(2), "fractional bytes round up");
    }

    #[test]
    fn refuses_bad_quantities() {
        assert!(matches!(parse_bytes(""), Err(QuantityError::Empty(_))));
        assert!(matches!(
            parse_bytes("-1Gi"),
            Err(QuantityError::Negative(_))
        ));
        assert!(matches!(
            parse_bytes("20GB"),
            Err(QuantityError::UnknownSuffix(s, _)) if s == "GB"
        ));
        assert!(matches!(
            parse_bytes("lots"),
            Err(QuantityError::NotANumber(..) | QuantityError::UnknownSuffix(..))
        ));
        assert!(matches!(
            parse_bytes("1.2.3Gi"),
            Err(QuantityError::NotANumber(..))
        ));
        assert!(matches!(
            parse_bytes("20Ei"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_bytes("1e400"),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            parse_bytes("Gi"),
            Err(QuantityError::NotANumber(..))
        ));
        let message = parse_bytes("20GB").unwrap_err().to_string();
        assert!(message.contains("20Gi"), "{message}");
    }

    #[test]
    fn parameter_counts() {
        assert_eq!(parse_count("8.03B"), Ok(8_030_000_000));
        assert_eq!(parse_count("335M"), Ok(335_000_000));
        assert_eq!(parse_count("7B"), Ok(7_000_000_000));
        assert_eq!(parse_count("1.1T"), Ok(1_100_000_000_000));
        assert_eq!(parse_count("7b"), Ok(7_000_000_000));
        assert_eq!(parse_count("124000000"), Ok(124_000_000));
        assert!(parse_count("-7B").is_err());
        assert!(parse_count("7X").is_err());
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("").is_err());
        assert!(parse_count("99999999999T").is_err());
    }

    #[test]
    fn gib_formats_two_decimals() {
        assert_eq!(gib(3 << 29), "1.50 GiB");
    }
}
