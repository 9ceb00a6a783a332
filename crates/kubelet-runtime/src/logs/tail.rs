//! Upstream `tail.FindTailLineStartIndex`: where the last `n` lines of a
//! file start, found by reading backwards in blocks, never the whole file.

use std::io::{Read, Seek, SeekFrom};

const BLOCK: u64 = 4096;

/// The offset of the first of the last `n` lines of `f` (a final newline
/// does not start an empty line). Blocking: call it off the async runtime.
pub fn find_tail_line_start<F: Read + Seek>(mut f: F, n: u64) -> std::io::Result<u64> {
    let size = f.seek(SeekFrom::End(0))?;
    if n == 0 {
        return Ok(size);
    }
    let mut seen = 0u64;
    let mut end = size;
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let len = usize::try_from(end - start).unwrap_or(0);
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..len])?;
        for i in (0..len).rev() {
            let at = start + i as u64;
            if buf[i] != b'\n' || at == size - 1 {
                continue;
            }
            seen += 1;
            if seen == n {
                return Ok(at + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn tail(text: &str, n: u64) -> String {
        let at = find_tail_line_start(Cursor::new(text.as_bytes()), n).expect("tail");
        text[usize::try_from(at).expect("offset")..].to_string()
    }

    #[test]
    fn the_last_lines_across_block_boundaries() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(tail("a\nb\nc\n", 5), "a\nb\nc\n");
        assert_eq!(tail("a\nb\nc", 1), "c", "an unterminated last line counts");
        assert_eq!(tail("a\nb\n", 0), "");
        assert_eq!(tail("", 3), "");
        let long: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail(&long, 3), "line 2997\nline 2998\nline 2999\n");
        let at = find_tail_line_start(Cursor::new(long.as_bytes()), 2000).expect("tail");
        assert!(long[usize::try_from(at).expect("offset")..].starts_with("line 1000\n"));
    }
}
