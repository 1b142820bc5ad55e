//! Real servers for integration tests.
#![allow(dead_code)]

pub mod redis_server;
