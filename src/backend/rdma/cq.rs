//! rdma-core CQs: on mlx5's direct path a classic CQ (or one that compresses its CQEs,
//! `mlx5dv_create_cq`) whose ring the crate polls itself, on the verbs path a CQ rdma-core
//! polls (`ibv_create_cq_ex` where the provider has it).

use super::RdmaDev;
use crate::backend::spec::{CqRings, CqSpec, Stamps};
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::verbs;
use crate::verbs::ex::ApiChoice;
use mlx5::clock::TimestampFormat;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Numbers of verbs-path CQs (rdma-core does not expose the device's): the crate's own,
/// unique in the process, bit 31 set so that they never look like a device's 24-bit number.
fn verbs_cq_id() -> u32 {
    static IDS: AtomicU32 = AtomicU32::new(0);
    0x8000_0000 | (IDS.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff)
}

/// A CQ of `r` as `spec` says.
pub(crate) fn create_cq(
    r: &RdmaDev,
    spec: &CqSpec<'_>,
) -> Result<(Arc<verbs::objects::Cq>, CqRings, u32)> {
    let (entries, cqe_size, zip) = (spec.entries, spec.cqe_size, spec.zip);
    if cqe_size != 64 {
        return Err(Error::Unsupported(
            "128-byte CQEs on a verbs device: set MLX5_CQE_SIZE=128 for rdma-core",
        ));
    }
    let ch = spec.channel.and_then(|c| c.clone());
    if spec.timestamps && !r.attrs.clock.present() {
        return Err(Error::Timestamps {
            why: "the device has no completion clock (completion_timestamp_mask or \
                  hca_core_clock 0)",
        });
    }
    use rdma_sys::ibv_create_cq_wc_flags as W;
    if r.path != DataPath::Direct {
        if let Some(format) = zip {
            return Err(Error::CqeCompression {
                format,
                cqe_size,
                caps: None,
            });
        }
        let id = verbs_cq_id();
        // `BLUEFLAME_VERBS_API`, read when the CQ is created.
        let api = ApiChoice::current()?;
        // rdma-core converts the stamps itself (`ibv_wc_read_completion_wallclock_ns`: the
        // clock-info page, refreshed at each `ibv_start_poll`, or real time).
        let extra = if spec.timestamps {
            if api == ApiChoice::Legacy {
                return Err(Error::Timestamps {
                    why: "BLUEFLAME_VERBS_API=legacy: ibv_poll_cq reads no timestamp",
                });
            }
            W::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK.0 as u64
        } else {
            0
        };
        let cq = Arc::new(verbs::objects::Cq::with_channel(
            r.ctx.clone(),
            entries,
            ch,
            id as usize,
            api,
            extra,
        )?);
        if spec.timestamps && !cq.poll_ops.is_some_and(|o| o.has_wallclock()) {
            return Err(Error::Timestamps {
                why: "the provider has no ibv_wc_read_completion_wallclock_ns",
            });
        }
        // rdma-core converts free-running stamps (`mlx5dv_ts_to_ns`) but hands real-time
        // ones over as the CQE has them (commit 0c40d5351, "Avoid translation from free
        // running to real time").
        let stamps = spec.timestamps.then_some(match r.real_time_ts {
            true => Stamps::Cqe(TimestampFormat::RealTime),
            false => Stamps::Ns,
        });
        return Ok((cq.clone(), CqRings::Verbs { cq, stamps }, id));
    }
    // mlx5: poll the CQ's ring directly (rdma-core never polls it: a classic CQ, or an
    // extended one when it asks for timestamps, which decide the QPs' `ts_format` in the
    // kernel: free-running, or real time on a device that stamps so when wall-clock times
    // are asked for).
    // rdma-core asks the kernel for real-time stamps (`MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS`)
    // only for wall-clock times without raw ones (`create_cq`).
    let stamps = match spec.timestamps {
        false => None,
        true if r.real_time_ts => Some(TimestampFormat::RealTime),
        true => {
            // SAFETY: as above.
            if unsafe { crate::dv::clock_info(r.ctx.ctx.cast()) }.is_none() {
                return Err(Error::Timestamps {
                    why: "no clock-info page to convert the free-running clock \
                          (mlx5dv_get_clock_info failed)",
                });
            }
            Some(TimestampFormat::FreeRunning)
        }
    };
    let extra = match stamps {
        None => 0,
        Some(TimestampFormat::FreeRunning) => W::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64,
        Some(TimestampFormat::RealTime) => {
            W::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK.0 as u64
        }
    };
    let cq = Arc::new(match zip {
        None => verbs::objects::Cq::with_channel(
            r.ctx.clone(),
            entries,
            ch,
            0,
            ApiChoice::Legacy,
            extra,
        )?,
        Some(format) => {
            // rdma-core's test (`create_cq`) before asking, so that the error says what the
            // device supports.
            if !r.cqe_comp.unwrap_or_default().supports(format, 64) {
                return Err(Error::CqeCompression {
                    format,
                    cqe_size: 64,
                    caps: r.cqe_comp,
                });
            }
            let chp = ch.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
            // SAFETY: live context of an mlx5 device (the direct path runs only there); `chp`
            // is null or a live channel of it, kept alive by the CQ that adopts it.
            let cq = unsafe {
                crate::dv::create_cq_compressed(r.ctx.ctx.cast(), entries, format, chp.cast())?
            };
            // SAFETY: just created on this context with this channel; the CQ owns it now.
            unsafe { verbs::objects::Cq::adopt(r.ctx.clone(), cq.cast(), ch) }
        }
    });
    // SAFETY: a live CQ of an mlx5 device (the path is Direct only on mlx5).
    let raw = crate::dv::raw_cq(&unsafe { crate::dv::init_cq(cq.cq.cast())? })?;
    if let Some(format) = zip {
        // rdma-core's MLX5_CQE_SIZE=128 makes 128-byte entries.
        if !r
            .cqe_comp
            .unwrap_or_default()
            .supports(format, raw.cqe_size)
        {
            return Err(Error::CqeCompression {
                format,
                cqe_size: raw.cqe_size,
                caps: r.cqe_comp,
            });
        }
    }
    // rdma-core promises `ncqe - 1` entries of a ring of `ncqe` (`mlx5_create_cq`): the CQ
    // accounting shares out what it promises.
    let promised = cq.capacity();
    let cqn = raw.cqn;
    // Its number in its context, where its events read it (`IBV_EVENT_CQ_ERR` and its
    // channel's completion events name the `ibv_cq` only), as on the verbs path.
    // SAFETY: a live CQ, just made: nothing reads its context concurrently.
    unsafe { (*cq.cq).cq_context = cqn as usize as *mut _ };
    let rings = CqRings::Direct {
        raw,
        promised,
        compressed: zip.is_some(),
        stamps: stamps.map(Stamps::Cqe),
    };
    Ok((cq, rings, cqn))
}
