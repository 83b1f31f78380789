//! blueflame
