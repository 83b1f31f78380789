//! The UD scenarios of the differential test (`tests/scenarios/ud.rs`) on the software NIC
//! through the direct path: the outcomes every device must show. The rxe stage runs the same
//! list on rxe through the verbs path and compares (`tests/rxe/rxe_differential.rs`).

use crate::scenarios;

use blueflame::Device;
use scenarios::ud;

#[test]
fn ud_scenarios_on_the_software_nic() {
    let all = ud::run_all(&Device::sim());
    for o in all.iter().filter(|o| !o.grh.is_empty()) {
        println!("{}", ud::grh_deviation(o));
    }
    ud::check(&all);
}
