-- Issue 30: which provider's day `budget.reached` was told for. Every host
-- finds the budget reached on its own; one insert wins per provider and day
-- (`until`: 00:00 UTC of the next day), so the webhook is sent once, not
-- once per host.
CREATE TABLE budget_told (
    provider TEXT NOT NULL,
    until DOUBLE PRECISION NOT NULL,
    told_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (provider, until)
);
