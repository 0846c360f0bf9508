-- a split stack's prefill and decode engines are told apart, so a prompt is counted once (where the decode engine
-- got it) and each side's own sources can be shown
ALTER TABLE engine_samples ADD COLUMN role text NOT NULL DEFAULT 'both';
