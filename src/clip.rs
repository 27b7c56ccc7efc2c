//! Bounds on what a user wrote, wherever peakfit repeats it: a reply, an event, a log line.
//!
//! Anyone who can create or annotate a pod chooses its strings. Quoted in full, one 256 KiB
//! annotation became a 1.31 GB filter reply over 5,000 nodes and 10 KB log lines (issue 24); cut to
//! [`MAX_USER_BYTES`] a value still says what was wrong with it.

use std::borrow::Cow;

use crate::model::AnnotationError;

/// The most of one user string repeated: 256 bytes, cut at a character boundary, then
/// [`MARK`] and how many bytes were left out.
pub const MAX_USER_BYTES: usize = 256;

/// The most of a message that quotes user strings (a decoder's error, a refusal naming the
/// request's pod and node): 1 KiB, cut like a string.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// What follows a cut string: `…[12345 more bytes]`.
pub const MARK: &str = "…";

/// `s`, or its first `max` bytes (fewer, to end on a character boundary) followed by
/// `…[N more bytes]` when it is longer.
pub fn clip_to(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}{MARK}[{} more bytes]", &s[..end], s.len() - end))
}

/// [`clip_to`] at [`MAX_USER_BYTES`].
pub fn clip(s: &str) -> Cow<'_, str> {
    clip_to(s, MAX_USER_BYTES)
}

/// The error with its key and value cut to [`MAX_USER_BYTES`] and what it allows to 4
/// times that (the allowed values are ours, but a model-config error quotes the ConfigMap):
/// what the index keeps and every reply and log line shows.
pub fn annotation_error(e: AnnotationError) -> AnnotationError {
    let fits = |s: &str, max: usize| s.len() <= max;
    if fits(&e.key, MAX_USER_BYTES)
        && fits(&e.value, MAX_USER_BYTES)
        && fits(&e.allowed, 4 * MAX_USER_BYTES)
    {
        return e;
    }
    AnnotationError {
        key: clip(&e.key).into_owned(),
        value: clip(&e.value).into_owned(),
        allowed: clip_to(&e.allowed, 4 * MAX_USER_BYTES).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_pass_and_long_ones_are_cut_on_a_character_boundary() {
        assert_eq!(clip("llama-3-8b"), "llama-3-8b");
        let long = "é".repeat(200); // 400 bytes
        let c = clip(&long);
        assert!(c.starts_with(&"é".repeat(128)), "{c}");
        assert!(c.ends_with("…[144 more bytes]"), "{c}");
        assert!(c.len() < MAX_USER_BYTES + 32);
    }

    #[test]
    fn an_annotation_error_keeps_its_shape_with_the_value_cut() {
        let e = annotation_error(AnnotationError::new(
            "model",
            &"x".repeat(1 << 18),
            "a name",
        ));
        assert_eq!(e.value.len(), MAX_USER_BYTES + "…[261888 more bytes]".len());
        assert!(e.to_string().ends_with("is not valid: a name"), "{e}");
    }
}
