//! Reading structure out of fuzz bytes, never failing: past the end every read gives zeros.

/// A cursor over an input.
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// The next byte, 0 past the end.
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next 8 bytes, little-endian, zero-padded past the end.
    pub(crate) fn u64(&mut self) -> u64 {
        let mut buf = [0u8; 8];
        for b in &mut buf {
            *b = self.byte();
        }
        u64::from_le_bytes(buf)
    }

    /// Whether nothing is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Everything left.
    pub(crate) fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// `data` split into lines at `\n`.
pub(crate) fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|&b| b == b'\n')
}

/// `line` split at its first `:` into a name and a value, the value's leading spaces removed
/// (`None` value when there is no `:`).
pub(crate) fn header(line: &[u8]) -> (&[u8], Option<&[u8]>) {
    match line.iter().position(|&b| b == b':') {
        Some(i) => {
            let value = &line[i + 1..];
            let start = value.iter().position(|&b| b != b' ').unwrap_or(value.len());
            (&line[..i], Some(&value[start..]))
        }
        None => (line, None),
    }
}
