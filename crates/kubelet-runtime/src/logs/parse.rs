//! The CRI log line format (upstream `parseCRILog`) and the timestamp
//! format the kubelet writes back (`RFC3339NanoFixed`).

use jiff::Timestamp;

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

/// One parsed line.
#[derive(Debug, PartialEq)]
pub struct LogLine<'a> {
    /// When the runtime wrote it.
    pub timestamp: Timestamp,
    /// Its stream.
    pub stream: Stream,
    /// The content; a full line (`F`) keeps its newline, a partial one (`P`)
    /// loses it, as upstream writes them.
    pub content: &'a [u8],
}

/// Why a line is not in the CRI format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// No space after the timestamp.
    #[error("timestamp is not found")]
    NoTimestamp,
    /// Not RFC 3339.
    #[error("unexpected timestamp format")]
    BadTimestamp,
    /// No space after the stream.
    #[error("stream type is not found")]
    NoStream,
    /// Neither stdout nor stderr.
    #[error("unexpected stream type")]
    BadStream,
    /// No space after the tag.
    #[error("log tag is not found")]
    NoTag,
}

fn split_space(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == b' ')?;
    Some((&b[..i], &b[i + 1..]))
}

/// Parses `<timestamp> <stream> <tag>[:<more tags>] <content>`.
pub fn parse_cri_line(line: &[u8]) -> Result<LogLine<'_>, ParseError> {
    let (ts, rest) = split_space(line).ok_or(ParseError::NoTimestamp)?;
    let timestamp = std::str::from_utf8(ts)
        .ok()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .ok_or(ParseError::BadTimestamp)?;
    let (stream, rest) = split_space(rest).ok_or(ParseError::NoStream)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return Err(ParseError::BadStream),
    };
    let (tags, mut content) = split_space(rest).ok_or(ParseError::NoTag)?;
    // Tags are `:`-separated and forward compatible; the first says partial.
    let partial = tags.split(|&c| c == b':').next() == Some(b"P");
    if partial && content.ends_with(b"\n") {
        content = &content[..content.len() - 1];
    }
    Ok(LogLine {
        timestamp,
        stream,
        content,
    })
}

/// Upstream `RFC3339NanoFixed` in UTC: nine fractional digits, always.
pub fn format_timestamp(t: Timestamp) -> String {
    let secs = t.strftime("%Y-%m-%dT%H:%M:%S");
    format!("{secs}.{:09}Z", t.subsec_nanosecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_partial_lines_as_upstream_parses_them() {
        let l = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F log content 1\n")
            .expect("full");
        assert_eq!(l.stream, Stream::Stdout);
        assert_eq!(l.content, b"log content 1\n");
        assert_eq!(
            format_timestamp(l.timestamp),
            "2016-10-06T00:17:09.669794202Z"
        );
        let l = parse_cri_line(b"2016-10-06T00:17:09.669794203Z stderr P part\n").expect("partial");
        assert_eq!((l.stream, l.content), (Stream::Stderr, &b"part"[..]));
        let l = parse_cri_line(b"2016-10-06T00:17:09Z stdout F:x y z\n").expect("tags");
        assert_eq!(l.content, b"y z\n");
        assert_eq!(
            format_timestamp(l.timestamp),
            "2016-10-06T00:17:09.000000000Z"
        );
        let l = parse_cri_line(b"2016-10-06T02:17:09.5+02:00 stdout F offset\n").expect("offset");
        assert_eq!(
            format_timestamp(l.timestamp),
            "2016-10-06T00:17:09.500000000Z"
        );
    }

    #[test]
    fn malformed_lines_are_refused() {
        assert_eq!(parse_cri_line(b"garbage"), Err(ParseError::NoTimestamp));
        assert_eq!(
            parse_cri_line(b"yesterday stdout F x\n"),
            Err(ParseError::BadTimestamp)
        );
        assert_eq!(
            parse_cri_line(b"2016-10-06T00:17:09Z stdin F x\n"),
            Err(ParseError::BadStream)
        );
        assert_eq!(
            parse_cri_line(b"2016-10-06T00:17:09Z stdout"),
            Err(ParseError::NoStream)
        );
        assert_eq!(
            parse_cri_line(b"2016-10-06T00:17:09Z stdout F"),
            Err(ParseError::NoTag)
        );
    }
}
