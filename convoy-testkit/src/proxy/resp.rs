//! The proxy's RESP parser: where RESP2/RESP3 frames end in a byte stream
//! (incrementally, for replies that arrive in many chunks), and a request
//! as far as the fault rules look into it (its name, a script's SHA1).

use std::fmt;

/// The longest RESP header line or inline command accepted before the
/// stream is treated as unparsable (Redis itself allows 64 KiB).
const MAX_LINE: usize = 64 * 1024;
/// Command names longer than this are not matched by
/// [`Match::Command`](super::Match::Command).
pub(super) const NAME_MAX: usize = 32;
/// Length of a SHA1 in hex.
const SHA_LEN: usize = 40;

/// A request as much as the rules need: its name and, for scripts, the
/// SHA1. Fixed size, so queueing it allocates nothing.
#[derive(Clone, Copy)]
pub(super) struct RequestKey {
    name: [u8; NAME_MAX],
    /// 0 also for a name too long to keep.
    name_len: u8,
    sha: [u8; SHA_LEN],
    has_sha: bool,
}

impl RequestKey {
    /// `hash_eval`: hash the body of an `EVAL` (only worth it while rules
    /// exist).
    pub(super) fn new(request: &Request<'_>, hash_eval: bool) -> Self {
        let mut key = Self {
            name: [0; NAME_MAX],
            name_len: 0,
            sha: [0; SHA_LEN],
            has_sha: false,
        };
        if request.name.len() <= NAME_MAX {
            key.name[..request.name.len()].copy_from_slice(request.name);
            key.name.make_ascii_uppercase();
            key.name_len = request.name.len() as u8;
        }
        let name = key.name();
        let arg1 = request.arg1.unwrap_or_default();
        if name == b"EVALSHA" || name == b"EVALSHA_RO" {
            key.set_sha(arg1);
        } else if hash_eval
            && (name == b"EVAL" || name == b"EVAL_RO")
            && let Ok(body) = std::str::from_utf8(arg1)
        {
            key.set_sha(redis::Script::new(body).get_hash().as_bytes());
        }
        key
    }

    fn set_sha(&mut self, sha: &[u8]) {
        if sha.len() == SHA_LEN {
            self.sha.copy_from_slice(sha);
            self.sha.make_ascii_lowercase();
            self.has_sha = true;
        }
    }

    pub(super) fn name(&self) -> &[u8] {
        &self.name[..usize::from(self.name_len)]
    }

    pub(super) fn sha(&self) -> Option<&[u8]> {
        self.has_sha.then_some(&self.sha[..])
    }
}

/// One request, as far as the proxy looks into it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request<'a> {
    /// How many words (command name included).
    pub(super) argc: usize,
    /// The command name (empty if it could not be read).
    pub(super) name: &'a [u8],
    /// The first argument.
    pub(super) arg1: Option<&'a [u8]>,
}

impl<'a> Request<'a> {
    /// Reads one complete request frame, as [`FrameScanner::requests`]
    /// delimits them.
    pub(super) fn parse(frame: &'a [u8]) -> Self {
        if frame.first() == Some(&b'*') {
            Self::parse_multibulk(frame)
        } else {
            Self::parse_inline(frame)
        }
    }

    fn parse_multibulk(frame: &'a [u8]) -> Self {
        let mut request = Request {
            argc: 0,
            name: b"",
            arg1: None,
        };
        let Some((header, mut rest)) = split_line(&frame[1..]) else {
            return request;
        };
        request.argc = match parse_len(header) {
            Ok(Some(argc)) => argc,
            _ => return request,
        };
        let mut words = [None; 2];
        for word in words.iter_mut().take(request.argc) {
            let Some(after) = rest.strip_prefix(b"$") else {
                break;
            };
            let Some((len, data)) = split_line(after) else {
                break;
            };
            let Ok(Some(len)) = parse_len(len) else {
                break;
            };
            let Some(bytes) = data.get(..len) else {
                break;
            };
            *word = Some(bytes);
            rest = data.get(len + 2..).unwrap_or_default();
        }
        request.name = words[0].unwrap_or_default();
        request.arg1 = words[1];
        request
    }

    fn parse_inline(frame: &'a [u8]) -> Self {
        let mut words = frame
            .split(u8::is_ascii_whitespace)
            .filter(|word| !word.is_empty());
        let name = words.next();
        let arg1 = words.next();
        Request {
            argc: usize::from(name.is_some()) + usize::from(arg1.is_some()) + words.count(),
            name: name.unwrap_or_default(),
            arg1,
        }
    }
}

/// One complete RESP frame found by [`FrameScanner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    /// Its length in bytes.
    pub(super) len: usize,
    /// Its type byte (`*`, `$`, `>`, ...; the value's, after an attribute),
    /// or [`INLINE`].
    pub(super) kind: u8,
}

/// [`Frame::kind`] of an inline command (a request that is a plain line).
const INLINE: u8 = b' ';

/// Why bytes are not RESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProtocolError(&'static str);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Finds where RESP2/RESP3 frames end in a byte stream, incrementally: fed
/// the same frame again with more bytes after [`scan`](Self::scan) returned
/// `None`, it resumes where it stopped instead of starting over, so a huge
/// reply arriving in many chunks is scanned once.
#[derive(Debug)]
pub(super) struct FrameScanner {
    /// Requests: a frame not starting with `*` is an inline command.
    requests: bool,
    /// Where scanning resumes, from the start of the frame.
    pos: usize,
    /// For each open aggregate, innermost last: values still to come.
    open: Vec<usize>,
    /// The frame began with an attribute; its value follows.
    top_attribute: bool,
    /// The type byte of the top-level value (0 until it is read).
    kind: u8,
}

impl FrameScanner {
    pub(super) fn requests() -> Self {
        Self::new(true)
    }

    pub(super) fn replies() -> Self {
        Self::new(false)
    }

    fn new(requests: bool) -> Self {
        Self {
            requests,
            pos: 0,
            open: Vec::new(),
            top_attribute: false,
            kind: 0,
        }
    }

    /// The next frame of `buf`, which starts where the previous frame
    /// ended; `None` while it is incomplete (call again with more bytes
    /// appended to the same frame).
    pub(super) fn scan(&mut self, buf: &[u8]) -> Result<Option<Frame>, ProtocolError> {
        loop {
            let Some(&ty) = buf.get(self.pos) else {
                return Ok(None);
            };
            let top = self.open.is_empty();
            if top && self.requests && !self.top_attribute && ty != b'*' {
                let rest = &buf[self.pos..];
                let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
                    return if rest.len() > MAX_LINE {
                        Err(ProtocolError("an inline command is too long"))
                    } else {
                        Ok(None)
                    };
                };
                self.pos += newline + 1;
                return Ok(Some(self.finish(INLINE)));
            }
            let rest = &buf[self.pos + 1..];
            let Some((line, after)) = split_line(rest) else {
                return if rest.len() > MAX_LINE {
                    Err(ProtocolError("a header line is too long"))
                } else {
                    Ok(None)
                };
            };
            let next = buf.len() - after.len();
            let (end, children) = match ty {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => (next, 0),
                b'$' | b'!' | b'=' => match parse_len(line)? {
                    None => (next, 0),
                    Some(len) => {
                        let end = next
                            .checked_add(len)
                            .and_then(|end| end.checked_add(2))
                            .ok_or(ProtocolError("a bulk string is too long"))?;
                        let Some(data) = buf.get(next..end) else {
                            return Ok(None);
                        };
                        if !data.ends_with(b"\r\n") {
                            return Err(ProtocolError("a bulk string does not end with CRLF"));
                        }
                        (end, 0)
                    }
                },
                b'*' | b'~' | b'>' => (next, parse_len(line)?.unwrap_or(0)),
                b'%' | b'|' => {
                    let values = parse_len(line)?
                        .unwrap_or(0)
                        .checked_mul(2)
                        .ok_or(ProtocolError("a map is too long"))?;
                    // A nested attribute is followed by the value it
                    // annotates, which is what its parent counts; so it
                    // ends after that value. On top, the frame goes on after
                    // it (see `complete`).
                    let annotated = usize::from(ty == b'|' && !top);
                    (next, values + annotated)
                }
                _ => return Err(ProtocolError("an unknown RESP type byte")),
            };
            if top {
                if ty == b'|' {
                    self.top_attribute = true;
                } else {
                    self.kind = ty;
                }
            }
            self.pos = end;
            if children > 0 {
                self.open.push(children);
            } else if let Some(frame) = self.complete() {
                return Ok(Some(frame));
            }
        }
    }

    /// A value just ended: counts it in its parents; the frame if it was
    /// the top-level value.
    fn complete(&mut self) -> Option<Frame> {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return None;
            }
            self.open.pop();
        }
        if self.top_attribute && self.kind == 0 {
            // A top-level attribute ended; the value it annotates follows.
            return None;
        }
        Some(self.finish(self.kind))
    }

    fn finish(&mut self, kind: u8) -> Frame {
        let frame = Frame {
            len: self.pos,
            kind,
        };
        self.pos = 0;
        self.open.clear();
        self.top_attribute = false;
        self.kind = 0;
        frame
    }
}

/// Splits `bytes` at its first CRLF: the line before it and the rest after.
fn split_line(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.windows(2).position(|pair| pair == b"\r\n")?;
    Some((&bytes[..end], &bytes[end + 2..]))
}

/// A RESP length: `None` for `-1` (a RESP2 null).
fn parse_len(line: &[u8]) -> Result<Option<usize>, ProtocolError> {
    if line == b"-1" {
        return Ok(None);
    }
    if line.is_empty() {
        return Err(ProtocolError("empty length"));
    }
    let mut len: usize = 0;
    for &digit in line {
        if !digit.is_ascii_digit() {
            return Err(ProtocolError("bad length"));
        }
        len = len
            .checked_mul(10)
            .and_then(|len| len.checked_add(usize::from(digit - b'0')))
            .ok_or(ProtocolError("length too large"))?;
    }
    Ok(Some(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every frame of `bytes`, scanned in one go.
    fn frames(requests: bool, bytes: &[u8]) -> Result<Vec<Frame>, ProtocolError> {
        let mut scanner = FrameScanner::new(requests);
        let mut start = 0;
        let mut found = Vec::new();
        while let Some(frame) = scanner.scan(&bytes[start..])? {
            found.push(frame);
            start += frame.len;
        }
        assert_eq!(start, bytes.len(), "trailing bytes in {bytes:?}");
        Ok(found)
    }

    /// The same, fed one byte more at a time (as if every byte arrived in a
    /// read of its own).
    fn frames_bytewise(requests: bool, bytes: &[u8]) -> Vec<Frame> {
        let mut scanner = FrameScanner::new(requests);
        let mut start = 0;
        let mut found = Vec::new();
        for end in 1..=bytes.len() {
            while let Some(frame) = scanner.scan(&bytes[start..end]).expect("valid RESP") {
                found.push(frame);
                start += frame.len;
            }
        }
        assert_eq!(start, bytes.len());
        found
    }

    fn kinds(found: &[Frame]) -> Vec<u8> {
        found.iter().map(|frame| frame.kind).collect()
    }

    const REPLIES: &[&[u8]] = &[
        b"+OK\r\n",
        b"-ERR wrong\r\n",
        b":42\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"$6\r\na\r\nb\r\n\r\n",
        b"*2\r\n$3\r\nfoo\r\n*2\r\n:1\r\n*1\r\n+deep\r\n",
        b"_\r\n",
        b",3.14\r\n",
        b"#t\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
        b"!21\r\nSYNTAX invalid syntax\r\n",
        b"=15\r\ntxt:Some string\r\n",
        b"%2\r\n+first\r\n:1\r\n+second\r\n*2\r\n:2\r\n:3\r\n",
        b"~3\r\n+a\r\n+b\r\n+c\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
        b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n*2\r\n:2039123\r\n:9543892\r\n",
        b"*3\r\n:1\r\n|1\r\n+ttl\r\n:3600\r\n:2\r\n:3\r\n",
        b"%0\r\n",
    ];

    const REPLY_KINDS: &[u8] = b"+-:$$$**$*_,#(!=%~>**%";

    #[test]
    fn every_resp_type_is_one_frame() {
        for (reply, kind) in REPLIES.iter().zip(REPLY_KINDS) {
            let found = frames(false, reply).expect("valid RESP");
            assert_eq!(
                found,
                [Frame {
                    len: reply.len(),
                    kind: *kind
                }],
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn incomplete_input_resumes_at_every_split() {
        let all: Vec<u8> = REPLIES.concat();
        let at_once = frames(false, &all).expect("valid RESP");
        assert_eq!(kinds(&at_once), REPLY_KINDS);
        assert_eq!(frames_bytewise(false, &all), at_once);
        // Every prefix that stops inside a frame is incomplete, not wrong.
        for reply in REPLIES {
            for end in 0..reply.len() {
                let mut scanner = FrameScanner::replies();
                assert_eq!(scanner.scan(&reply[..end]), Ok(None), "{reply:?}[..{end}]");
            }
        }
    }

    #[test]
    fn a_huge_reply_in_many_chunks_is_one_frame() {
        let mut reply = b"*100000\r\n".to_vec();
        for i in 0..100_000 {
            reply.extend_from_slice(format!("$5\r\n{:05}\r\n", i % 100_000).as_bytes());
        }
        reply.extend_from_slice(b"+next\r\n");
        let mut scanner = FrameScanner::replies();
        let mut found = Vec::new();
        let mut start = 0;
        for end in (0..reply.len()).step_by(1000).chain([reply.len()]) {
            while let Some(frame) = scanner.scan(&reply[start..end]).expect("valid RESP") {
                found.push(frame);
                start += frame.len;
            }
        }
        assert_eq!(kinds(&found), b"*+");
        assert_eq!(found[0].len, reply.len() - b"+next\r\n".len());
    }

    #[test]
    fn pipelined_requests_are_split_and_read() {
        let bytes = b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nset\r\n$1\r\nk\r\n$2\r\nv\n\r\n\
                      *2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING hi\r\n\r\n*0\r\n";
        let found = frames(true, bytes).expect("valid RESP");
        assert_eq!(kinds(&found), b"***  *");
        assert_eq!(frames_bytewise(true, bytes), found);
        let mut start = 0;
        let mut requests = Vec::new();
        for frame in &found {
            requests.push(Request::parse(&bytes[start..start + frame.len]));
            start += frame.len;
        }
        let read =
            |argc, name: &'static [u8], arg1: Option<&'static [u8]>| Request { argc, name, arg1 };
        assert_eq!(
            requests,
            [
                read(1, b"PING", None),
                read(3, b"set", Some(b"k")),
                read(2, b"GET", Some(b"k")),
                read(2, b"PING", Some(b"hi")),
                read(0, b"", None),
                read(0, b"", None),
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_resp_are_an_error() {
        for bad in [
            &b"?what\r\n"[..],
            b"$3\r\nabcd\r\n",
            b"$x\r\n",
            b"*-2\r\n",
            b":1\r\n*1\r\n@\r\n",
        ] {
            assert!(frames(false, bad).is_err(), "{bad:?}");
        }
        let mut long = vec![b'+'; MAX_LINE + 10];
        long[0] = b'+';
        assert!(FrameScanner::replies().scan(&long).is_err());
        assert!(FrameScanner::requests().scan(&long[1..]).is_err());
    }
}
