//! A minimal protobuf reader, for the few messages of XLA the node reads: the optimized
//! program of an executable (`HloModuleProto`, `xla/service/hlo.proto`) and the shapes in it
//! (`xla/xla_data.proto`). Generated bindings would bring a protobuf toolchain and XLA's
//! `.proto` files for a handful of fields; the wire format is simple enough to walk by hand.

pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// One field's value: the wire types the node reads, and the rest skipped.
pub(super) enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(super) fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(super) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// Next (field number, value); `None` at end, `Some(Err)` on garbage.
    pub(super) fn next(&mut self) -> Option<Result<(u64, Field<'a>), ()>> {
        if self.at_end() {
            return None;
        }
        let key = match self.varint() {
            Some(k) => k,
            None => return Some(Err(())),
        };
        let field = key >> 3;
        let r = match key & 7 {
            0 => self.varint().map(Field::Varint),
            1 => self.skip(8),
            2 => self.varint().and_then(|len| {
                let len = usize::try_from(len).ok()?;
                let end = self.pos.checked_add(len)?;
                let s = self.buf.get(self.pos..end)?;
                self.pos = end;
                Some(Field::Bytes(s))
            }),
            5 => self.skip(4),
            _ => None,
        };
        Some(r.map(|f| (field, f)).ok_or(()))
    }

    fn skip(&mut self, n: usize) -> Option<Field<'a>> {
        let end = self.pos.checked_add(n)?;
        if end > self.buf.len() {
            return None;
        }
        self.pos = end;
        Some(Field::Other)
    }
}

/// Returns the first length-delimited field `num` of a message.
pub(super) fn sub_message(msg: &[u8], num: u64) -> Option<&[u8]> {
    sub_messages(msg, num).next()
}

/// Every length-delimited field `num` of a message (a repeated message field), stopping at
/// the first malformed byte.
pub(super) fn sub_messages(msg: &[u8], num: u64) -> impl Iterator<Item = &[u8]> {
    let mut r = Reader::new(msg);
    std::iter::from_fn(move || loop {
        match r.next()? {
            Ok((n, Field::Bytes(b))) if n == num => return Some(b),
            Ok(_) => {}
            Err(()) => return None,
        }
    })
}

/// The first varint field `num` of a message.
pub(super) fn varint_field(msg: &[u8], num: u64) -> Option<u64> {
    let mut r = Reader::new(msg);
    loop {
        match r.next()? {
            Ok((n, Field::Varint(v))) if n == num => return Some(v),
            Ok(_) => {}
            Err(()) => return None,
        }
    }
}
