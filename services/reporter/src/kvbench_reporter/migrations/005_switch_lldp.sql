-- what each good switch read saw in its LLDP-MIB remote table (the switch's side of the cable check)
ALTER TABLE switch_reads ADD COLUMN lldp_remote jsonb NOT NULL DEFAULT '[]';
