//! Integration tests: the real daemon over its real socket. One module per area.

mod smoke;
