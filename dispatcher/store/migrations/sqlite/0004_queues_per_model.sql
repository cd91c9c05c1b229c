-- A model may now be served by several providers: API tasks queue per model
-- ("api-model:<model>", every serving lane takes it) instead of per provider
-- ("api:<provider>"). Rows stored before move over; `account` keeps the
-- provider a running one is bound to. The attempts table keeps its history
-- as it was written.
UPDATE tasks SET lane_group = 'api-model:' || model WHERE kind = 'api' AND lane_group LIKE 'api:%';
