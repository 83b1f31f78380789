//! WQEs that straddle the end of a small send ring, and tens of thousands of posts over
//! many ring wraps and past the 16-bit producer-index wrap.

use crate::common;

use blueflame::*;
use common::*;

/// One kind of WQE in the wrap test, with the blocks it takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Inline200,
    Inline8,
    Inline40,
    Sgl8,
    Read4,
    SendInline200,
    FetchAdd,
    MaskedCs64,
    WriteImmSgl3,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::Inline200,
        Kind::Inline8,
        Kind::Inline40,
        Kind::Sgl8,
        Kind::Read4,
        Kind::SendInline200,
        Kind::FetchAdd,
        Kind::MaskedCs64,
        Kind::WriteImmSgl3,
    ];

    fn blocks(self) -> u32 {
        match self {
            Kind::Inline200 => 4,     // 2 + 13 DS
            Kind::Inline8 => 1,       // 2 + 1 DS
            Kind::Inline40 => 2,      // 2 + 3 DS
            Kind::Sgl8 => 3,          // 2 + 8 DS
            Kind::Read4 => 2,         // 2 + 4 DS
            Kind::SendInline200 => 4, // 1 + 13 DS
            Kind::FetchAdd => 1,      // 4 DS
            Kind::MaskedCs64 => 2,    // 5 DS
            Kind::WriteImmSgl3 => 2,  // 2 + 3 DS
        }
    }
}

/// Regions of the wrap test.
struct Bufs {
    src: MemoryRegion,
    dst: MemoryRegion,
    atom: MemoryRegion,
    rbuf: MemoryRegion,
}

/// Which region a check reads.
#[derive(Copy, Clone, Debug)]
enum Region {
    Src,
    Dst,
    Atom,
    Rbuf,
}

/// Bytes expected at an offset of a region once a WQE completed.
type Check = (Region, usize, Vec<u8>);

impl Bufs {
    fn get(&self, r: Region) -> &MemoryRegion {
        match r {
            Region::Src => &self.src,
            Region::Dst => &self.dst,
            Region::Atom => &self.atom,
            Region::Rbuf => &self.rbuf,
        }
    }
}

/// Posts one WQE of `kind` with data derived from `n`; returns the bytes to check after its
/// completion.
fn post(s: &mut Setup, b: &Bufs, kind: Kind, n: u64, flags: PostFlags) -> Vec<Check> {
    let data = pattern(256, n);
    match kind {
        Kind::Inline200 | Kind::Inline8 | Kind::Inline40 => {
            let len = match kind {
                Kind::Inline200 => 200,
                Kind::Inline8 => 8,
                _ => 40,
            };
            s.a.write_inline(&data[..len], b.dst.remote(0).unwrap(), n, flags)
                .unwrap();
            vec![(Region::Dst, 0, data[..len].to_vec())]
        }
        Kind::Sgl8 => {
            b.src.write(0, &data).unwrap();
            let sgl: Vec<Sge> = (0..8)
                .map(|i| b.src.sge(i * 32, 7 + i as u32).unwrap())
                .collect();
            let mut want = Vec::new();
            for i in 0..8 {
                want.extend_from_slice(&data[i * 32..i * 32 + 7 + i]);
            }
            s.a.write(&sgl, b.dst.remote(300).unwrap(), n, flags)
                .unwrap();
            vec![(Region::Dst, 300, want)]
        }
        Kind::Read4 => {
            b.dst.write(1000, &data[..100]).unwrap();
            let sgl = [
                b.src.sge(1000, 10).unwrap(),
                b.src.sge(1100, 20).unwrap(),
                b.src.sge(1200, 30).unwrap(),
                b.src.sge(1300, 40).unwrap(),
            ];
            s.a.read(&sgl, b.dst.remote(1000).unwrap(), n, flags)
                .unwrap();
            vec![
                (Region::Src, 1000, data[..10].to_vec()),
                (Region::Src, 1100, data[10..30].to_vec()),
                (Region::Src, 1200, data[30..60].to_vec()),
                (Region::Src, 1300, data[60..100].to_vec()),
            ]
        }
        Kind::SendInline200 => {
            s.resp()
                .post_recv(&[b.rbuf.sge(0, 256).unwrap()], n)
                .unwrap();
            s.a.send(Payload::Inline(&data[..200]), n, flags).unwrap();
            vec![(Region::Rbuf, 0, data[..200].to_vec())]
        }
        Kind::FetchAdd => {
            let before = b.atom.read_u64(0).unwrap();
            s.a.fetch_add(
                b.atom.remote(0).unwrap(),
                n,
                b.atom.sge(8, 8).unwrap(),
                n,
                flags,
            )
            .unwrap();
            vec![
                (
                    Region::Atom,
                    0,
                    before.wrapping_add(n).to_ne_bytes().to_vec(),
                ),
                (Region::Atom, 8, before.to_ne_bytes().to_vec()),
            ]
        }
        Kind::MaskedCs64 => {
            b.atom.write(16, &n.wrapping_sub(1).to_ne_bytes()).unwrap();
            let op = MaskedAtomic::Cs64 {
                swap: n,
                compare: n.wrapping_sub(1),
                swap_mask: u64::MAX,
                compare_mask: u64::MAX,
            };
            s.a.post(
                &Request::Masked {
                    remote: b.atom.remote(16).unwrap(),
                    op,
                    local: b.atom.sge(24, 8).unwrap(),
                },
                n,
                flags,
            )
            .unwrap();
            vec![
                (Region::Atom, 16, n.to_ne_bytes().to_vec()),
                (Region::Atom, 24, n.wrapping_sub(1).to_ne_bytes().to_vec()),
            ]
        }
        Kind::WriteImmSgl3 => {
            b.src.write(2000, &data[..90]).unwrap();
            s.resp().post_recv(&[], n).unwrap();
            let sgl = [
                b.src.sge(2000, 30).unwrap(),
                b.src.sge(2030, 30).unwrap(),
                b.src.sge(2060, 30).unwrap(),
            ];
            s.a.write_imm(
                Payload::Sgl(&sgl),
                b.dst.remote(500).unwrap(),
                n as u32,
                n,
                flags,
            )
            .unwrap();
            vec![(Region::Dst, 500, data[..90].to_vec())]
        }
    }
}

fn expected_opcode(k: Kind) -> (WcOpcode, u32) {
    match k {
        Kind::Read4 => (WcOpcode::RdmaRead, 100),
        Kind::SendInline200 => (WcOpcode::Send, 0),
        Kind::FetchAdd => (WcOpcode::FetchAdd, 8),
        Kind::MaskedCs64 => (WcOpcode::MaskedCompSwap, 8),
        _ => (WcOpcode::RdmaWrite, 0),
    }
}

fn takes_recv(k: Kind) -> bool {
    matches!(k, Kind::SendInline200 | Kind::WriteImmSgl3)
}

/// Posts 3000 WQEs of every kind, one at a time, on a 16-block ring (sizes 1 to 4 blocks,
/// so the start drifts around the ring) and checks that many of them straddle the ring end
/// and that every one moves its bytes and reports its completion.
fn wrap(loopback: bool, bf_size: u32) {
    let caps = QpCaps {
        sq_blocks: 16,
        bf_size,
        ..QpCaps::default()
    };
    let mut s = Setup::new(loopback, caps, caps);
    let b = Bufs {
        src: s.mr(4096, Access::LOCAL_WRITE),
        dst: s.mr(4096, ALL),
        atom: s.mr(64, ALL),
        rbuf: s.mr(256, Access::LOCAL_WRITE),
    };
    let q = s.a.qpn();
    let rq = s.resp_qpn();
    let mut pi: u64 = 0;
    let mut straddles = 0;
    let mut n: u64 = 0;
    for i in 0..3000usize {
        let kind = Kind::ALL[(i * 7 + i / 9) % Kind::ALL.len()];
        n += 1;
        let free = free_send(&mut s.a);
        assert_eq!(free, 16);
        let checks = post(&mut s, &b, kind, n, PostFlags::SIGNALED);
        assert_eq!(free - free_send(&mut s.a), kind.blocks(), "{kind:?}");
        if pi % 16 + kind.blocks() as u64 > 16 {
            straddles += 1;
        }
        pi += kind.blocks() as u64;
        let (c, r) = s.run_expect(1, takes_recv(kind) as usize);
        let (op, len) = expected_opcode(kind);
        assert_ok(&c[0], n, op, len, q);
        for (region, off, want) in checks {
            assert_eq!(
                bytes(b.get(region), off, want.len()),
                want,
                "{kind:?} #{n} {region:?}+{off}"
            );
        }
        if let Some(r) = r.first() {
            assert!(r.is_ok(), "{r:?}");
            assert_eq!((r.cookie, r.qpn), (n, rq));
            if kind == Kind::WriteImmSgl3 {
                assert_eq!(
                    (r.opcode, r.byte_len, r.imm),
                    (WcOpcode::RecvRdmaWithImm, 90, Some(n as u32))
                );
            } else {
                assert_eq!((r.opcode, r.byte_len, r.imm), (WcOpcode::Recv, 200, None));
            }
        }
        assert_eq!(free_send(&mut s.a), 16);
    }
    assert!(
        straddles > 200,
        "only {straddles} WQEs straddled the ring end"
    );
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, n);
    assert_eq!(st.bf_mismatches, 0, "{st:?}");
    assert_eq!(st.bf_violations, 0, "{st:?}");
    assert_eq!(st.doorbell_misses, 0, "{st:?}");
    assert_eq!(st.doorbells, n, "{st:?}");
    if bf_size == 0 {
        assert_eq!(st.bf_copies, 0);
        assert_eq!(st.db_writes, n);
    } else {
        // Everything here is at most 4 blocks = 256 bytes: always a BlueFlame copy, whose
        // source wraps at the ring end like the WQE.
        assert_eq!(st.bf_copies, n, "{st:?}");
        assert_eq!(st.db_writes, 0, "{st:?}");
    }
}

#[test]
fn wrap_one_at_a_time_blueflame_loopback() {
    wrap(true, 256);
}

#[test]
fn wrap_one_at_a_time_blueflame_pair() {
    wrap(false, 256);
}

#[test]
fn wrap_one_at_a_time_doorbell_only() {
    wrap(false, 0);
}

/// Many WQEs in flight at once on the small ring: bursts of writes that fill it, with the
/// data of each checked in its own slot.
#[test]
fn wrap_bursts_fill_the_small_ring() {
    let caps = QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    };
    let mut s = Setup::pair(caps);
    let dst = s.mr(16 * 256, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src = s.mr(4096, Access::LOCAL_WRITE);
    let q = s.a.qpn();
    let mut n = 0u64;
    let mut pi = 0u64;
    let mut straddles = 0;
    for round in 0..500u64 {
        let mut posted = Vec::new();
        let mut blocks_in_flight = 0u64;
        // Sizes cycle so the starting position drifts around the ring.
        let sizes = [200usize, 8, 40, 100, 200, 12, 60];
        let mut k = round as usize;
        loop {
            let len = sizes[k % sizes.len()];
            k += 1;
            let data = pattern(len, n + 1);
            let slot = posted.len();
            let r = if k % 3 == 0 {
                // The same bytes through a two-entry gather list.
                src.write(slot * 256, &data).unwrap();
                let h = len / 2;
                let sgl = [
                    src.sge(slot * 256, h as u32).unwrap(),
                    src.sge(slot * 256 + h, (len - h) as u32).unwrap(),
                ];
                s.a.write(
                    &sgl,
                    dst.remote(slot * 256).unwrap(),
                    n + 1,
                    PostFlags::SIGNALED,
                )
            } else {
                s.a.write_inline(
                    &data,
                    dst.remote(slot * 256).unwrap(),
                    n + 1,
                    PostFlags::SIGNALED,
                )
            };
            match r {
                Ok(()) => {}
                Err(Error::QueueFull { .. }) => break,
                Err(e) => panic!("{e:?}"),
            }
            n += 1;
            let blocks = if k % 3 == 0 {
                1
            } else {
                bbs(2 + inline_ds(len))
            } as u64;
            if pi % 16 + blocks > 16 {
                straddles += 1;
            }
            pi += blocks;
            blocks_in_flight += blocks;
            posted.push((n, data));
        }
        assert!(!posted.is_empty());
        assert_eq!(free_send(&mut s.a) as u64, 16 - blocks_in_flight);
        let (c, _) = s.run_expect(posted.len(), 0);
        for ((n, data), (slot, c)) in posted.iter().zip(c.iter().enumerate()) {
            assert_ok(c, *n, WcOpcode::RdmaWrite, 0, q);
            assert_eq!(bytes(&dst, slot * 256, data.len()), *data, "cookie {n}");
        }
        assert_eq!(free_send(&mut s.a), 16);
    }
    assert!(straddles > 100, "{straddles}");
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, n);
    assert_eq!(
        (st.bf_mismatches, st.bf_violations, st.doorbell_misses),
        (0, 0, 0),
        "{st:?}"
    );
}

/// 50 000 writes of 1 to 3 blocks (about 100 000 blocks: the 16-bit producer index wraps),
/// posted in bursts and polled as they go; every cookie comes back once, in order, and
/// every write's bytes land.
fn many(loopback: bool, sq_blocks: u32, cq_entries: u32) {
    let caps = QpCaps {
        sq_blocks,
        ..QpCaps::default()
    };
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(cq_entries).unwrap();
    let cq_b = dev.create_cq(16).unwrap();
    let mut a = pd.create_qp(&cq, &cq, caps).unwrap();
    let b = if loopback {
        let q = a.endpoint().unwrap();
        a.connect(&q).unwrap();
        None
    } else {
        let mut b = pd.create_qp(&cq_b, &cq_b, caps).unwrap();
        a.connect(&b.endpoint().unwrap()).unwrap();
        b.connect(&a.endpoint().unwrap()).unwrap();
        Some(b)
    };
    let slots = 512usize;
    let dst = pd
        .alloc_mr(slots * 128, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    const N: u64 = 50_000;
    let sizes = [8usize, 40, 100, 20, 60];
    let mut next_post = 0u64;
    let mut next_done = 0u64;
    let mut blocks_posted = 0u64;
    let mut out = [Completion::default(); 64];
    let mut buf = [0u8; 128];
    while next_done < N {
        // Post until the burst is done, the ring is full or the CQ could overflow.
        let mut burst = 0;
        while next_post < N && burst < 200 && next_post - next_done < cq_entries as u64 {
            let len = sizes[next_post as usize % sizes.len()];
            let v = next_post.to_le_bytes();
            let mut data = [0u8; 100];
            for (i, d) in data[..len].iter_mut().enumerate() {
                *d = v[i % 8] ^ i as u8;
            }
            let slot = (next_post as usize) % slots;
            match a.write_inline(
                &data[..len],
                dst.remote(slot * 128).unwrap(),
                next_post,
                PostFlags::SIGNALED,
            ) {
                Ok(()) => {}
                Err(Error::QueueFull { needed, free, .. }) => {
                    assert_eq!(needed, bbs(2 + inline_ds(len)));
                    assert!(free < needed);
                    break;
                }
                Err(e) => panic!("{e:?}"),
            }
            blocks_posted += bbs(2 + inline_ds(len)) as u64;
            next_post += 1;
            burst += 1;
        }
        dev.process();
        loop {
            let k = cq.poll(&mut out);
            if k == 0 {
                break;
            }
            for c in &out[..k] {
                assert_eq!(c.cookie, next_done, "{c:?}");
                assert_eq!(c.status, WcStatus::Success);
                assert_eq!(c.opcode, WcOpcode::RdmaWrite);
                assert_eq!(c.qpn, a.qpn());
                let len = sizes[next_done as usize % sizes.len()];
                let slot = (next_done as usize) % slots;
                dst.read(slot * 128, &mut buf[..len]).unwrap();
                let v = next_done.to_le_bytes();
                for (i, d) in buf[..len].iter().enumerate() {
                    assert_eq!(*d, v[i % 8] ^ i as u8, "cookie {next_done} byte {i}");
                }
                next_done += 1;
            }
        }
    }
    assert!(blocks_posted > 0x1_0000, "{blocks_posted}");
    assert_eq!(next_post, N);
    assert_eq!(free_send(&mut a), sq_blocks);
    assert_eq!(dev.process(), 0);
    assert_eq!(cq.poll(&mut out), 0);
    let st = nic(&dev).qp_stats(a.qpn()).unwrap();
    assert_eq!(st.wqes, N);
    assert_eq!((st.bf_mismatches, st.bf_violations), (0, 0), "{st:?}");
    drop(b);
}

#[test]
fn fifty_thousand_writes_loopback() {
    many(true, 256, 256);
}

#[test]
fn fifty_thousand_writes_pair_small_ring_small_cq() {
    many(false, 16, 16);
}

#[test]
fn fifty_thousand_writes_big_ring() {
    many(false, 4096, 1024);
}

/// 70 000 one-block unsignaled NOPs plus signaled writes: the producer index wraps past
/// 0xffff with one-block steps, and the WQE counter of the CQE after the wrap maps to the
/// right cookie.
#[test]
fn producer_index_wraps_one_block_at_a_time() {
    let mut s = Setup::loopback(QpCaps::default());
    let dst = s.mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let q = s.a.qpn();
    let mut pi = 0u32;
    let mut cookie = 0u64;
    while pi < 0x1_0000 + 1000 {
        for _ in 0..99 {
            s.a.post(&Request::Nop, u64::MAX, PostFlags::UNSIGNALED)
                .unwrap();
        }
        cookie += 1;
        s.a.write_inline(
            &cookie.to_le_bytes(),
            dst.remote(0).unwrap(),
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
        pi += 100;
        let (c, _) = s.run_expect(1, 0);
        assert_ok(&c[0], cookie, WcOpcode::RdmaWrite, 0, q);
        assert_eq!(dst.read_u64(0).unwrap(), cookie.to_le());
        assert_eq!(free_send(&mut s.a), 256);
    }
    assert_eq!(nic(&s.dev).qp_stats(q).unwrap().wqes, pi as u64);
}
