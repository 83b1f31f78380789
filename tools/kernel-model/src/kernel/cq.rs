//! Completion channels and CQs (`mlx5_ib_create_cq` -> `create_cq_user`), and where a CQ's
//! completion events go.

use super::objects::{Cq, File, Obj};
use crate::abi::{self, *};
use crate::cmd::Call;
use crate::events::{self, Subject};
use libc::c_int;
use mlx5::sim::{CqEventSink, HostCq, Nic};

/// Where a CQ's completion events go: its channel, naming the user's handle.
struct ChannelSink {
    fd: c_int,
    user: u64,
}

impl CqEventSink for ChannelSink {
    fn cq_event(&self, cqn: u32) {
        events::push(self.fd, Subject::Cq(cqn), &self.user.to_ne_bytes());
    }
}

/// `CREATE_COMP_CHANNEL`: an event file for completion events (8-byte records).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn create_comp_channel(f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let _ = unsafe { call.request::<ib_uverbs_create_comp_channel>() };
    let fd = events::create(8)?;
    f.add(Obj::Channel(fd));
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&ib_uverbs_create_comp_channel_resp { fd: fd as u32 }, None) }
}

/// `CREATE_CQ` and `EX_CREATE_CQ`; of the extended flags (`check_cq_create_flags`) only
/// `IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION`, where the NIC has a clock (it stamps every
/// CQE; `IGNORE_OVERRUN` is not modelled).
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn create_cq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    unsafe {
        let (spec, udata) = if call.ex {
            let (c, udata) = call.request::<ib_uverbs_ex_create_cq>();
            let stamps = IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION;
            if c.flags & !stamps != 0 || (c.flags & stamps != 0 && nic.hw_clock().khz == 0) {
                return Err(libc::EOPNOTSUPP);
            }
            ((c.cqe, c.comp_channel, c.user_handle), udata)
        } else {
            let (c, udata) = call.request::<ib_uverbs_create_cq>();
            ((c.cqe, c.comp_channel, c.user_handle), udata)
        };
        create_cq_with(nic, f, call, spec, udata)
    }
}

/// `CREATE_CQ`: `mlx5_ib_create_cq` -> `create_cq_user`: the provider's ring and record
/// (`buf_addr`, `db_addr`), `entries = roundup_pow_of_two(cqe + 1)`, the CQE size and
/// compression it asks for, armed through the UAR page it names (`uar_page_index`).
///
/// # Safety
/// As [`super::command`]'s calls.
unsafe fn create_cq_with(
    nic: &Nic,
    f: &mut File,
    call: &Call<'_>,
    (cqe, channel, user): (u32, i32, u64),
    udata: &[u8],
) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_cq = unsafe { crate::cmd::read(udata) };
    // MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS, where the context said real time (the NIC
    // stamps every CQE in its format: the flag is checked, not acted on).
    let rt = nic.hw_clock().format == mlx5::clock::TimestampFormat::RealTime;
    let known = if rt {
        MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS as u16
    } else {
        0
    };
    if udata.len() < core::mem::size_of::<mlx5_ib_create_cq>() || u.flags & !known != 0 {
        return Err(libc::EINVAL);
    }
    let entries = cqe
        .checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .ok_or(libc::EINVAL)?;
    if entries > 1 << 22 || !(u.cqe_size == 64 || u.cqe_size == 128) {
        return Err(libc::EINVAL);
    }
    let page = f
        .pages
        .get(&(false, u32::from(u.uar_page_index)))
        .copied()
        .ok_or(libc::EINVAL)?;
    let mem = HostCq {
        buf: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
        uar: page as *mut u8,
    };
    // SAFETY: the provider's ring of entries * cqe_size bytes and its record, which it
    // frees only after DESTROY_CQ; the UAR page is mapped for the file's life.
    let raw = unsafe { nic.create_cq_at(entries, u.cqe_size, mem) }.map_err(|_| libc::EINVAL)?;
    if u.cqe_comp_en != 0 {
        let format = match u.cqe_comp_res_format {
            1 => mlx5::cqe::MiniCqeFormat::Hash,
            2 => mlx5::cqe::MiniCqeFormat::Csum,
            4 => mlx5::cqe::MiniCqeFormat::CsumStridx,
            _ => {
                let _ = nic.destroy_cq(raw.cqn);
                return Err(libc::EINVAL);
            }
        };
        if nic.compress_cq(raw.cqn, format).is_err() {
            let _ = nic.destroy_cq(raw.cqn);
            return Err(libc::EOPNOTSUPP);
        }
    }
    let channel = if channel >= 0 {
        if !f
            .objs
            .values()
            .any(|o| matches!(o, Obj::Channel(c) if *c == channel))
        {
            let _ = nic.destroy_cq(raw.cqn);
            return Err(libc::EINVAL);
        }
        let sink = std::sync::Arc::new(ChannelSink { fd: channel, user });
        let _ = nic.set_cq_event_sink(raw.cqn, Some(sink));
        Some(channel)
    } else {
        None
    };
    let h = f.add(Obj::Cq(Cq {
        cqn: raw.cqn,
        user,
        channel,
        real_time: u.flags & MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS as u16 != 0,
    }));
    let resp = ib_uverbs_create_cq_resp {
        cq_handle: h,
        cqe: entries - 1,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe {
        call.respond(
            &resp,
            Some(&mlx5_ib_create_cq_resp {
                cqn: raw.cqn,
                reserved: 0,
            }),
        )
    }
}

/// `DESTROY_CQ` (`EBUSY` while a QP uses it), with the events the user read of it.
///
/// # Safety
/// As [`super::command`]'s calls.
pub(super) unsafe fn destroy_cq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_destroy_cq>() };
    let Some(Obj::Cq(cq)) = f.objs.get(&c.cq_handle) else {
        return Err(libc::EINVAL);
    };
    let (cqn, channel) = (cq.cqn, cq.channel);
    nic.destroy_cq(cqn).map_err(|_| libc::EBUSY)?;
    f.objs.remove(&c.cq_handle);
    let resp = ib_uverbs_destroy_cq_resp {
        comp_events_reported: channel.map_or(0, |fd| events::reported(fd, Subject::Cq(cqn))),
        async_events_reported: f
            .async_fd
            .map_or(0, |fd| events::reported(fd, Subject::Cq(cqn))),
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}
