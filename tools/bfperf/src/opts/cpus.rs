//! The CPUs of the system and perftest's `--pin_cores` list.

/// The CPUs the system has (perftest's `sysconf(_SC_NPROCESSORS_CONF)`; 1 if it cannot
/// say).
pub fn configured_cpus() -> usize {
    // SAFETY: sysconf reads a system constant; it takes no pointer.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Parses perftest's `--pin_cores` list (`parse_cpu_list`: single CPUs, ranges `a-b`,
/// separated by commas, as `0-3,8,12-15`) on a system of `cpus` CPUs.
///
/// # Errors
/// A message naming what is wrong, as perftest's: a bad number or character, a range whose
/// start exceeds its end, a CPU the system does not have, an empty list.
pub fn cpu_list(list: &str, cpus: usize) -> Result<Vec<usize>, String> {
    let bad = |why: String| format!("--pin_cores={list}: {why}");
    let cpu = |t: &str| -> Result<usize, String> {
        let c: usize = t
            .parse()
            .map_err(|_| bad(format!("'{t}' is not a CPU number")))?;
        if c >= cpus || c >= libc::CPU_SETSIZE as usize {
            return Err(bad(format!(
                "CPU {c} out of range: the system has {cpus} (0-{})",
                cpus - 1
            )));
        }
        Ok(c)
    };
    let mut out = Vec::new();
    for item in list.split(',') {
        if item.is_empty() {
            return Err(bad("an empty item (a list is like 0-3,8,12-15)".into()));
        }
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu(a)?, cpu(b)?);
                if a > b {
                    return Err(bad(format!("range {a}-{b}: start > end")));
                }
                out.extend(a..=b);
            }
            None => out.push(cpu(item)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
