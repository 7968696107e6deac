//! [`RemoteRegion`]: a registered buffer as a peer sees it, and its bytes on the wire.

use hetmem::{Error, Result};

/// The kind of memory a region is, as NIXL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// Host memory (`DRAM_SEG`).
    Host,
    /// A GPU's device memory (`VRAM_SEG`), on the CUDA device the region names.
    Device,
}

impl RegionKind {
    pub(crate) fn mem_type(self) -> nixl_sys::MemType {
        match self {
            RegionKind::Host => nixl_sys::MemType::Dram,
            RegionKind::Device => nixl_sys::MemType::Vram,
        }
    }

    fn code(self) -> u8 {
        match self {
            RegionKind::Host => 1,
            RegionKind::Device => 2,
        }
    }
}

/// A peer's registered buffer, or a range of it: where a transfer writes to or reads from.
/// Made by the owner's [`Registered::remote`](crate::Registered::remote) and sent as bytes
/// ([`RemoteRegion::to_bytes`]); ranges of it by [`RemoteRegion::range`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    agent: String,
    kind: RegionKind,
    address: u64,
    len: u64,
    device: u64,
}

/// The first bytes of a region on the wire, and its version.
const MAGIC: &[u8; 4] = b"HMRR";
const VERSION: u8 = 1;
/// Magic, version, kind, device, address, length, the name's length.
const HEADER: usize = 4 + 1 + 1 + 8 + 8 + 8 + 2;

impl RemoteRegion {
    pub(crate) fn new(agent: String, kind: RegionKind, address: u64, len: u64, device: u64) -> RemoteRegion {
        RemoteRegion { agent, kind, address, len, device }
    }

    /// The name of the agent that registered it.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Host or device memory.
    pub fn kind(&self) -> RegionKind {
        self.kind
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: registered buffers hold at least one byte, and ranges too.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA device of device memory (0 for host memory).
    pub fn device(&self) -> u64 {
        self.device
    }

    pub(crate) fn address(&self) -> u64 {
        self.address
    }

    /// `len` bytes of the region from byte `offset`.
    ///
    /// # Errors
    /// An empty range, or one that does not lie inside the region.
    pub fn range(&self, offset: u64, len: u64) -> Result<RemoteRegion> {
        let end = offset.checked_add(len);
        if len == 0 || end.is_none_or(|end| end > self.len) {
            return Err(Error::invalid(
                "remote region range",
                format!(
                    "{len} bytes from byte {offset} of a {}-byte region: give a non-empty range inside it",
                    self.len
                ),
            ));
        }
        Ok(RemoteRegion { address: self.address + offset, len, ..self.clone() })
    }

    /// The region as bytes, for the peer that will move data into or out of it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let name = self.agent.as_bytes();
        let mut bytes = Vec::with_capacity(HEADER + name.len());
        bytes.extend_from_slice(MAGIC);
        bytes.push(VERSION);
        bytes.push(self.kind.code());
        for word in [self.device, self.address, self.len] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        // Agent names come from `Agent::new`, which refuses names longer than u16::MAX bytes.
        bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
        bytes.extend_from_slice(name);
        bytes
    }

    /// A region from the bytes its owner's [`RemoteRegion::to_bytes`] made.
    ///
    /// # Errors
    /// Bytes that are not such a region: another format or version, an unknown kind, an empty
    /// region or one that wraps the address space, a name cut short or not UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Result<RemoteRegion> {
        let bad = |problem: String| Error::invalid("remote region bytes", problem);
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return Err(bad(format!(
                "{} bytes that do not start a hetmem remote region: pass the bytes of the owner's \
                 RemoteRegion::to_bytes, unchanged",
                bytes.len()
            )));
        }
        if bytes[4] != VERSION {
            return Err(bad(format!(
                "version {} (this hetmem reads version {VERSION}): use one hetmem on both sides",
                bytes[4]
            )));
        }
        let kind = match bytes[5] {
            1 => RegionKind::Host,
            2 => RegionKind::Device,
            other => return Err(bad(format!("memory kind {other}: 1 (host) or 2 (device) expected"))),
        };
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        let (device, address, len) = (word(6), word(14), word(22));
        if len == 0 || address.checked_add(len).is_none() {
            return Err(bad(format!(
                "{len} bytes at {address:#x}: an empty region, or one past the address space"
            )));
        }
        let name_len = u16::from_le_bytes([bytes[30], bytes[31]]) as usize;
        if bytes.len() != HEADER + name_len {
            return Err(bad(format!(
                "{} bytes where the region's agent name needs {}: the bytes were cut short or run on",
                bytes.len(),
                HEADER + name_len
            )));
        }
        let agent = String::from_utf8(bytes[HEADER..].to_vec())
            .map_err(|_| bad("an agent name that is not UTF-8".to_string()))?;
        Ok(RemoteRegion { agent, kind, address, len, device })
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    fn region() -> RemoteRegion {
        RemoteRegion::new("peer-ä".into(), RegionKind::Device, 0x7f00_0000_1000, 1 << 20, 3)
    }

    #[test]
    fn a_region_survives_its_bytes() {
        let region = region();
        assert_eq!(RemoteRegion::from_bytes(&region.to_bytes()).unwrap(), region);
    }

    #[test]
    fn bytes_that_are_not_a_region_are_refused_with_the_cause() {
        let good = region().to_bytes();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (Vec::new(), "do not start"),
            (b"HMRX".iter().copied().chain(good[4..].iter().copied()).collect(), "do not start"),
            (good[..good.len() - 1].to_vec(), "cut short"),
            ([good.as_slice(), b"x"].concat(), "run on"),
        ];
        let mut version = good.clone();
        version[4] = 9;
        cases.push((version, "version 9"));
        let mut kind = good.clone();
        kind[5] = 7;
        cases.push((kind, "memory kind 7"));
        let mut empty = good.clone();
        empty[22..30].fill(0);
        cases.push((empty, "empty region"));
        let mut wraps = good.clone();
        wraps[14..22].copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push((wraps, "past the address space"));
        let mut name = good.clone();
        let at = name.len() - 1;
        name[at] = 0xFF;
        cases.push((name, "not UTF-8"));
        for (bytes, cause) in cases {
            match RemoteRegion::from_bytes(&bytes) {
                Err(Error::InvalidArgument { problem, .. }) => assert!(problem.contains(cause), "{problem}"),
                other => panic!("expected {cause:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn ranges_stay_inside_the_region() {
        let region = region();
        let part = region.range(4096, 512).unwrap();
        assert_eq!((part.address(), part.len(), part.agent()), (region.address() + 4096, 512, "peer-ä"));
        assert_eq!(region.range(0, 1 << 20).unwrap(), region);
        for (offset, len) in [(0, 0), (1, 1 << 20), (1 << 20, 1), (u64::MAX, 2), (2, u64::MAX)] {
            assert!(region.range(offset, len).is_err(), "{offset} + {len}");
        }
    }
}
