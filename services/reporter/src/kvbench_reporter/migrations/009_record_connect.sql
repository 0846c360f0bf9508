-- time a request spent opening a new connection before its send; null when a kept-alive one was reused
ALTER TABLE request_records ADD COLUMN connect_s double precision;
