-- Argo CD health check for meshplan.dev/LLMDeployment.
--
-- Install it in the argocd-cm ConfigMap (docs/install.md, "Argo CD"):
--   resource.customizations.health.meshplan.dev_LLMDeployment: |
--     <this file>
--
-- It reads only what meshplan writes in status (operator/meshplan/controller/status.py):
-- observedGeneration and the conditions Planned, Placed, Available, Progressing,
-- Degraded, ScalingLimited. Argo CD runs gopher-lua (Lua 5.1): no goto, no integer
-- division. Tested in tests/test_chart_argocd_health.py with Lua 5.1.
--
--   no status yet / status of an older generation      -> Progressing
--   Planned=False (InvalidSpec, NoFeasiblePlan, ...)    -> Degraded, with the planner's message
--   Degraded=True (replicas missing or restarted)       -> Degraded
--   Placed=False (not enough free GPUs for a replica)   -> Degraded
--   desiredReplicas = 0                                 -> Suspended (scaled to zero)
--   Available=True and Progressing not True             -> Healthy
--   otherwise (replicas starting, rolling update)       -> Progressing

local hs = {}

local function find(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the meshplan operator to plan this deployment"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "meshplan has not yet reconciled generation " .. tostring(generation)
  return hs
end

local conditions = obj.status.conditions
local planned = find(conditions, "Planned")
local placed = find(conditions, "Placed")
local available = find(conditions, "Available")
local progressing = find(conditions, "Progressing")
local degraded = find(conditions, "Degraded")

if planned ~= nil and planned.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(planned, "no plan")
  return hs
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "degraded")
  return hs
end

if placed ~= nil and placed.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(placed, "not placed")
  return hs
end

if obj.status.desiredReplicas == 0 then
  hs.status = "Suspended"
  hs.message = "Scaled to zero replicas"
  return hs
end

if available ~= nil and available.status == "True" and
    (progressing == nil or progressing.status ~= "True") then
  hs.status = "Healthy"
  hs.message = describe(available, "available")
  return hs
end

hs.status = "Progressing"
if progressing ~= nil and progressing.status == "True" then
  hs.message = describe(progressing, "progressing")
else
  hs.message = describe(available, "waiting for replicas")
end
return hs
