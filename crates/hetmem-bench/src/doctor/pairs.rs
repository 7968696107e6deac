//! Pairs of GPUs: how they are connected (NVML topology) and whether each can address the
//! other's memory (peer access). What a fan-out over several GPUs can expect from them.

use super::Check;
use hetmem::backend::cuda::CudaDevice;
use hetmem::backend::nvml::NvmlSession;

/// Two GPUs as the doctor reports them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PairReport {
    /// The first device's index.
    pub a: usize,
    /// The second device's index.
    pub b: usize,
    /// Their closest common ancestor in the PCIe tree (NVML): `internal`, `single_switch`,
    /// `multiple_switches`, `host_bridge`, `numa_node` or `system`.
    pub topology: Option<String>,
    /// Why the topology is unknown, where it is.
    pub topology_error: Option<String>,
    /// Kernels on `a` can address `b`'s memory (`cuDeviceCanAccessPeer`).
    pub peer_access_a_to_b: Option<bool>,
    /// Kernels on `b` can address `a`'s memory.
    pub peer_access_b_to_a: Option<bool>,
    /// Why peer access is unknown, where it is.
    pub peer_error: Option<String>,
}

impl PairReport {
    /// Describes every pair of `devices` (none for fewer than two).
    pub fn gather_all(devices: &[CudaDevice], nvml: Result<&NvmlSession, &String>) -> Vec<PairReport> {
        let mut pairs = Vec::new();
        for (i, a) in devices.iter().enumerate() {
            for b in &devices[i + 1..] {
                pairs.push(PairReport::gather(a, b, nvml));
            }
        }
        pairs
    }

    fn gather(a: &CudaDevice, b: &CudaDevice, nvml: Result<&NvmlSession, &String>) -> PairReport {
        let topology =
            nvml.map_err(String::clone).and_then(|nvml| nvml.topology(a.pci_bus_id(), b.pci_bus_id()));
        let peer = a.can_access_peer(b).and_then(|ab| Ok((ab, b.can_access_peer(a)?)));
        PairReport {
            a: a.ordinal(),
            b: b.ordinal(),
            topology: topology.as_ref().ok().map(|level| level.to_string()),
            topology_error: topology.err(),
            peer_access_a_to_b: peer.as_ref().ok().map(|&(ab, _)| ab),
            peer_access_b_to_a: peer.as_ref().ok().map(|&(_, ba)| ba),
            peer_error: peer.err().map(|error| error.to_string()),
        }
    }

    /// The check line for this pair.
    pub fn check(&self) -> Check {
        let scope = format!("devices {}-{}", self.a, self.b);
        let topology = self.topology.as_deref().unwrap_or("unknown");
        match (self.peer_access_a_to_b, self.peer_access_b_to_a) {
            (Some(true), Some(true)) => Check::ok(
                &scope,
                "peer_access",
                format!("peer access both ways; connected through {topology}"),
            ),
            (Some(ab), Some(ba)) => Check::warn(
                &scope,
                "peer_access",
                format!(
                    "peer access {}->{}: {}, {}->{}: {}; connected through {topology}",
                    self.a,
                    self.b,
                    yes_no(ab),
                    self.b,
                    self.a,
                    yes_no(ba)
                ),
                "data between these GPUs goes through host memory; a fan-out of frames (each GPU with \
                 its own host link) does not need peer access",
            ),
            _ => Check::warn(
                &scope,
                "peer_access",
                format!("peer access unknown: {}", self.peer_error.as_deref().unwrap_or("no answer")),
                "check `nvidia-smi topo -m`",
            ),
        }
    }
}

/// The check for the machine's pairs: one line for a single GPU, one per pair otherwise.
pub(crate) fn pair_checks(gpus: usize, pairs: &[PairReport]) -> Vec<Check> {
    match gpus {
        0 => Vec::new(),
        1 => vec![Check::ok("devices", "gpu_pairs", "one GPU: no pairs (a fan-out runs on that one)")],
        _ => pairs.iter().map(PairReport::check).collect(),
    }
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn pair(ab: Option<bool>, ba: Option<bool>) -> PairReport {
        PairReport {
            a: 0,
            b: 1,
            topology: Some("host_bridge".to_string()),
            topology_error: None,
            peer_access_a_to_b: ab,
            peer_access_b_to_a: ba,
            peer_error: ab.is_none().then(|| "CUDA_ERROR_INVALID_DEVICE".to_string()),
        }
    }

    #[test]
    fn one_gpu_says_so_and_none_says_nothing() {
        let one = pair_checks(1, &[]);
        assert_eq!((one.len(), one[0].status), (1, Status::Ok));
        assert!(one[0].detail.contains("one GPU: no pairs"), "{}", one[0].detail);
        assert!(pair_checks(0, &[]).is_empty());
    }

    #[test]
    fn each_pair_is_ok_only_with_peer_access_both_ways() {
        let checks = pair_checks(2, &[pair(Some(true), Some(true))]);
        assert_eq!((checks[0].status, checks[0].scope.as_str()), (Status::Ok, "devices 0-1"));
        assert!(checks[0].detail.contains("host_bridge"), "{}", checks[0].detail);
        let one_way = pair(Some(true), Some(false)).check();
        assert_eq!(one_way.status, Status::Warn);
        assert!(one_way.detail.contains("0->1: yes, 1->0: no"), "{}", one_way.detail);
        assert!(one_way.remedy.is_some());
        let unknown = pair(None, None).check();
        assert!(unknown.detail.contains("CUDA_ERROR_INVALID_DEVICE") && unknown.status == Status::Warn);
    }
}
