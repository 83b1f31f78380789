//! What a newcomer meets first: opening a device by name, and the crate's environment
//! variables. Each error names what was wrong, with its value.
//!
//! One test: the second sets an environment variable, which no other thread may read
//! meanwhile (rdma-core reads the environment too).
use blueflame::{Device, Error};

#[test]
fn first_errors_name_what_was_wrong() {
    open_names_the_device_it_could_not_open();
    a_malformed_gid_index_is_refused_with_its_value();
    cm_without_an_rdma_device_says_so();
}

/// `cm::listen` and `cm::resolve` on a host where rdma-core sees no device say that, typed
/// (they said only "rdma_create_event_channel failed: No such device").
fn cm_without_an_rdma_device_says_so() {
    let none = matches!(Device::open("mlx5_7", None), Err(Error::NoDevice { present, .. }) if present.is_empty());
    if !none {
        return; // a host with RDMA devices: rdma_cm finds them
    }
    let addr = "127.0.0.1:7471".parse().unwrap();
    let listen = blueflame::cm::listen(addr).map(|_| ());
    let resolve = blueflame::cm::resolve(addr, std::time::Duration::from_millis(10)).map(|_| ());
    for (what, r) in [("listen", listen), ("resolve", resolve)] {
        match r {
            Err(e @ Error::Unsupported(_)) => {
                assert!(e.to_string().contains("no RDMA device"), "{what}: {e}")
            }
            other => panic!("cm::{what} without an RDMA device: {other:?}"),
        }
    }
}

/// `Device::open` of a name rdma-core does not know (a typo, or no RDMA stack at all):
/// the error names the device asked for and the ones present. It said "ibv_get_device_list
/// failed: Function not implemented (os error 38)" on a host without ib_uverbs, and
/// "ibv_open_device failed: No such device (os error 19)" on one with devices.
fn open_names_the_device_it_could_not_open() {
    let e = Device::open("mlx5_7", None).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, Error::NoDevice { name, .. } if &**name == "mlx5_7"),
        "{e:?}"
    );
    assert!(text.contains("\"mlx5_7\""), "{text}");
}

/// A `BLUEFLAME_GID_INDEX` that is not a number is refused, with its value (it was dropped
/// silently and the default GID used), as `BLUEFLAME_PATH` and `BLUEFLAME_VERBS_API` refuse
/// theirs.
fn a_malformed_gid_index_is_refused_with_its_value() {
    std::env::set_var("BLUEFLAME_GID_INDEX", "abc");
    let r = Device::open_default();
    std::env::remove_var("BLUEFLAME_GID_INDEX");
    match r {
        Err(e @ Error::Environment { .. }) => {
            let Error::Environment { var, ref value } = e else {
                unreachable!()
            };
            assert_eq!((var, &**value), ("BLUEFLAME_GID_INDEX", "abc"));
            assert!(e.to_string().contains("GID table index"), "{e}");
        }
        other => panic!("BLUEFLAME_GID_INDEX=abc: {other:?}"),
    }
}
