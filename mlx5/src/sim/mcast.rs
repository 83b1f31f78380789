//! Multicast groups of the software NIC's port: which UD QPs are attached to which group
//! (`ibv_attach_mcast` / `ibv_detach_mcast`).
//!
//! A group is named by its multicast GID (first byte 0xff) and its multicast LID
//! (0xc000..=0xfffe), as `ibv_attach_mcast` takes them. A datagram whose address vector has
//! the GRH reaches the QPs attached with its destination GID; one without a GRH (InfiniBand
//! only) the QPs attached with its destination LID.
//!
//! The fabric: by default the port is cabled to itself (no switch), so a datagram reaches
//! every attached QP. With a switch in front ([`Groups::fabric`], `NicView::
//! set_multicast_fabric`), a multicast datagram leaves the port and the switch forwards it
//! back only to ports that are members of the group: the subnet manager programs the
//! switches' multicast forwarding from MCMemberRecord joins (`ib_sa_join_multicast`, what
//! `rdma_join_multicast` sends), so a group attached but never joined is lost on the wire,
//! as on an InfiniBand fabric. The port's joins ([`Groups::join`], [`Groups::leave`]) are
//! the subnet manager's records: each group gets its multicast LID at the first join.

use crate::av::{MULTICAST_LID_BASE, PERMISSIVE_LID};
use std::collections::BTreeMap;

/// One attachment: the group's GID and LID.
pub(crate) type Group = ([u8; 16], u16);

/// The attachments of every QP, and the port's memberships in the subnet manager's groups.
#[derive(Default)]
pub(crate) struct Groups {
    /// (group, QP) pairs, ordered so that delivery goes in QP-number order.
    members: BTreeMap<(Group, u32), ()>,
    /// A switch forwards multicast to the port only for groups it joined.
    pub(crate) fabric: bool,
    /// The groups the port joined: multicast GID -> (multicast LID, joins not left).
    joined: BTreeMap<[u8; 16], (u16, u32)>,
    /// The subnet manager's multicast LIDs handed out so far.
    mlids: u16,
}

/// Why an attach or detach is refused (what the kernel's `ib_attach_mcast` /
/// `ib_detach_mcast` return `EINVAL` for).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum McastError {
    /// The GID is not a multicast GID (first byte not 0xff).
    GidNotMulticast,
    /// The LID is not a multicast LID on an InfiniBand port.
    LidNotMulticast,
    /// Detach of a group the QP is not attached to.
    Unattached,
    /// A join when every multicast LID is held by a joined group.
    NoMlid,
}

/// Whether `gid` / `lid` name a multicast group on an InfiniBand port (the kernel's
/// `rdma_is_multicast_addr` and its LID range check in `ib_attach_mcast`).
pub(crate) fn check_group(gid: &[u8; 16], lid: u16) -> Result<(), McastError> {
    if gid[0] != 0xff {
        return Err(McastError::GidNotMulticast);
    }
    if !(MULTICAST_LID_BASE..PERMISSIVE_LID).contains(&lid) {
        return Err(McastError::LidNotMulticast);
    }
    Ok(())
}

impl Groups {
    /// Attaches `qpn` to a group (attaching twice is one attachment, as on mlx5).
    pub(crate) fn attach(&mut self, qpn: u32, g: Group) -> Result<(), McastError> {
        check_group(&g.0, g.1)?;
        self.members.insert((g, qpn), ());
        Ok(())
    }

    /// Detaches `qpn` from a group.
    pub(crate) fn detach(&mut self, qpn: u32, g: Group) -> Result<(), McastError> {
        check_group(&g.0, g.1)?;
        self.members
            .remove(&(g, qpn))
            .map(|_| ())
            .ok_or(McastError::Unattached)
    }

    /// Forgets every attachment of a destroyed QP.
    pub(crate) fn forget(&mut self, qpn: u32) {
        self.members.retain(|(_, q), _| *q != qpn);
    }

    /// A join of group `gid` by the port (an MCMemberRecord join): its multicast LID, the
    /// subnet manager's for the group (a new one at the group's first join).
    pub(crate) fn join(&mut self, gid: [u8; 16]) -> Result<u16, McastError> {
        if gid[0] != 0xff {
            return Err(McastError::GidNotMulticast);
        }
        if let Some((mlid, n)) = self.joined.get_mut(&gid) {
            *n += 1;
            return Ok(*mlid);
        }
        // The next multicast LID no joined group holds (a subnet manager never hands out a
        // live one); none left: refused, as an SM refuses a join it has no MLID for.
        let span = PERMISSIVE_LID - MULTICAST_LID_BASE - 1;
        let (k, mlid) = (0..span)
            .map(|k| (k, MULTICAST_LID_BASE + 1 + (self.mlids % span + k) % span))
            .find(|(_, m)| !self.joined.values().any(|(l, _)| l == m))
            .ok_or(McastError::NoMlid)?;
        self.mlids = (self.mlids % span + k + 1) % span;
        self.joined.insert(gid, (mlid, 1));
        Ok(mlid)
    }

    /// Ends one join of group `gid`; the port leaves the group with its last.
    pub(crate) fn leave(&mut self, gid: [u8; 16]) -> Result<(), McastError> {
        let (_, n) = self.joined.get_mut(&gid).ok_or(McastError::Unattached)?;
        *n -= 1;
        if *n == 0 {
            self.joined.remove(&gid);
        }
        Ok(())
    }

    /// Whether the switch forwards a datagram to this destination to the port: always
    /// without a switch; with one, when the port joined the group (by GID with a GRH, else
    /// by its multicast LID).
    fn forwarded(&self, dgid: Option<&[u8; 16]>, dlid: u16) -> bool {
        !self.fabric
            || match dgid {
                Some(g) => self.joined.contains_key(g),
                None => self.joined.values().any(|(mlid, _)| *mlid == dlid),
            }
    }

    /// The QPs a datagram to this destination reaches: by GID when it carries a GRH, else by
    /// LID. Each QP once, in QP-number order. None when the switch does not forward it.
    pub(crate) fn receivers(&self, dgid: Option<&[u8; 16]>, dlid: u16) -> Vec<u32> {
        if !self.forwarded(dgid, dlid) {
            return Vec::new();
        }
        let mut out: Vec<u32> = self
            .members
            .keys()
            .filter(|((gid, lid), _)| match dgid {
                Some(d) => gid == d,
                None => *lid == dlid,
            })
            .map(|(_, q)| *q)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The groups `qpn` is attached to.
    pub(crate) fn of(&self, qpn: u32) -> Vec<Group> {
        self.members
            .keys()
            .filter(|(_, q)| *q == qpn)
            .map(|(g, _)| *g)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MGID: [u8; 16] = [0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    #[test]
    fn attach_detach_and_receivers() {
        let mut g = Groups::default();
        assert_eq!(
            g.attach(1, ([0xfe; 16], 0xc001)),
            Err(McastError::GidNotMulticast)
        );
        assert_eq!(g.attach(1, (MGID, 5)), Err(McastError::LidNotMulticast));
        assert_eq!(
            g.attach(1, (MGID, 0xffff)),
            Err(McastError::LidNotMulticast)
        );
        g.attach(3, (MGID, 0xc001)).unwrap();
        g.attach(1, (MGID, 0xc001)).unwrap();
        g.attach(1, (MGID, 0xc001)).unwrap();
        assert_eq!(g.receivers(Some(&MGID), 0), vec![1, 3]);
        assert_eq!(g.receivers(None, 0xc001), vec![1, 3]);
        assert_eq!(g.receivers(None, 0xc002), Vec::<u32>::new());
        g.detach(1, (MGID, 0xc001)).unwrap();
        assert_eq!(g.detach(1, (MGID, 0xc001)), Err(McastError::Unattached));
        assert_eq!(g.receivers(Some(&MGID), 0), vec![3]);
        g.forget(3);
        assert!(g.of(3).is_empty());
    }

    /// Behind a switch, a group reaches the port only while it is joined; joins count;
    /// each group has its own multicast LID, the same at every join.
    #[test]
    fn a_switch_forwards_only_joined_groups() {
        let mut g = Groups::default();
        g.attach(1, (MGID, 0xc0ff)).unwrap();
        assert_eq!(
            g.receivers(Some(&MGID), 0),
            vec![1],
            "no switch: the port's own"
        );
        g.fabric = true;
        assert!(g.receivers(Some(&MGID), 0).is_empty(), "not joined");
        assert_eq!(g.join([0xfe; 16]), Err(McastError::GidNotMulticast));
        let mlid = g.join(MGID).unwrap();
        assert_eq!(g.join(MGID), Ok(mlid));
        let mut other = MGID;
        other[15] = 2;
        assert_ne!(g.join(other), Ok(mlid));
        assert_eq!(g.receivers(Some(&MGID), 0), vec![1]);
        assert!(
            g.receivers(None, mlid).is_empty(),
            "attached with another LID"
        );
        g.leave(MGID).unwrap();
        assert_eq!(g.receivers(Some(&MGID), 0), vec![1], "one join left");
        g.leave(MGID).unwrap();
        assert!(g.receivers(Some(&MGID), 0).is_empty());
        assert_eq!(g.leave(MGID), Err(McastError::Unattached));
    }

    /// The subnet manager's multicast LID counter came round to a LID a
    /// group still joined holds: two live groups share it.
    #[test]
    fn a_live_groups_mlid_is_never_handed_out_again() {
        let mut g = Groups {
            fabric: true,
            ..Groups::default()
        };
        let mlid = g.join(MGID).unwrap();
        g.attach(1, (MGID, mlid)).unwrap();
        let mut other = MGID;
        for i in 0..16_381u32 {
            other[12..16].copy_from_slice(&(i + 2).to_be_bytes());
            g.join(other).unwrap();
            g.leave(other).unwrap();
        }
        other[12..16].copy_from_slice(&999_999u32.to_be_bytes());
        let new = g.join(other).unwrap();
        g.attach(2, (other, new)).unwrap();
        assert_eq!(
            g.receivers(None, new),
            vec![2],
            "mlid {new:#x} of MGID {mlid:#x}"
        );
        assert_ne!(new, mlid, "MGID is still joined");
    }
}
