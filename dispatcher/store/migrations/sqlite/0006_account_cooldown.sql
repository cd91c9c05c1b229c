-- A cooling-down account (a usage cap) opens again by itself at this epoch
-- second; NULL when it is not cooling down.
ALTER TABLE accounts ADD COLUMN cooldown_until REAL;
