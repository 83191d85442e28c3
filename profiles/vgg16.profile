tutti-profile 1
model vgg16
batch 32
forward 0.755702847
optimizer 0.148554932
note measured: torchvision vgg16 (weights=None), SGD momentum 0.9, batch 4, 224x224 synthetic input, 2 threads, torch 1.13.0a0, on Intel(R) Xeon(R) Processor (2 CPUs); medians of 5 steps after 2 warm-up
note measured seconds: forward 2.61611 backward 4.50951 optimizer 0.514272 (backward after the last gradient, not listed: 4.59e-05)
note scaled: every time x 0.288865 so that batch 32 runs at 14.5 images/s (compute linear in the batch, the measured split kept)
note target: one Cori Phase-I (Cray XC40) Haswell node, 2x Xeon E5-2698 v3 (32 cores, 2.3 GHz), the machine of Lee et al. SC18 (MLHPC); one rank = one node
note 14.5 images/s is an estimate (Lee et al.'s single-node time was not found): 30 img/s for VGG-19 training with MKL-DNN on 2x Xeon Gold 6148 (PaddlePaddle benchmark/IntelOptimizedPaddle.md), x 19.6/15.5 GMAC per image (VGG-19/VGG-16), x 0.383 (SP peak 2.36/6.14 TFLOP/s, Haswell/Skylake node)
note batch 32 per node is assumed (the paper's per-node batch was not found); compute scales linearly: multiply every time by b/32 for batch b
grad classifier.6.bias 1000 f32 0.00959037979
grad classifier.6.weight 4096000 f32 4.08858952e-06
grad classifier.3.bias 4096 f32 0.05019693
grad classifier.3.weight 16777216 f32 4.94045126e-06
grad classifier.0.bias 4096 f32 0.282910574
grad classifier.0.weight 102760448 f32 5.95840929e-06
grad features.28.weight 2359296 f32 0.0641943525
grad features.28.bias 512 f32 2.57493931e-06
grad features.26.weight 2359296 f32 0.0497779937
grad features.26.bias 512 f32 3.10760471e-06
grad features.24.weight 2359296 f32 0.0520035836
grad features.24.bias 512 f32 2.75547896e-06
grad features.21.weight 2359296 f32 0.12016827
grad features.21.bias 512 f32 2.64744395e-06
grad features.19.weight 2359296 f32 0.0768767308
grad features.19.bias 512 f32 2.74421349e-06
grad features.17.weight 1179648 f32 0.0338040702
grad features.17.bias 512 f32 3.24308248e-06
grad features.14.weight 589824 f32 0.0761713454
grad features.14.bias 256 f32 2.77945591e-06
grad features.12.weight 589824 f32 0.0774346182
grad features.12.bias 256 f32 2.91724352e-06
grad features.10.weight 294912 f32 0.0519390458
grad features.10.bias 256 f32 2.64831093e-06
grad features.7.weight 147456 f32 0.129945932
grad features.7.bias 128 f32 3.21477379e-06
grad features.5.weight 73728 f32 0.0564481114
grad features.5.bias 128 f32 2.71474987e-06
grad features.2.weight 36864 f32 0.140029165
grad features.2.bias 64 f32 2.711861e-06
grad features.0.weight 1728 f32 0.0310935266
grad features.0.bias 64 f32 5.09672705e-06
